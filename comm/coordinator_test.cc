#include "comm/coordinator.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "comm/protocol.h"
#include "gtest/gtest.h"

namespace weft {
namespace comm {
namespace {

using Keys = std::vector<std::string>;

constexpr int32_t kInvalidArgumentCode = static_cast<int32_t>(absl::StatusCode::kInvalidArgument);
constexpr int32_t kDeadlineExceededCode =
    static_cast<int32_t>(absl::StatusCode::kDeadlineExceeded);
constexpr int64_t kSecond = 1000000;

Descriptor Make(OpType op, const std::string& name, std::vector<int64_t> shape = {4},
                DType dtype = DType::kFloat32) {
  Descriptor d;
  d.op = op;
  d.key = name;
  d.display = absl::StrCat(OpName(op), " '", name, "'");
  d.dtype = dtype;
  d.shape.assign(shape.begin(), shape.end());
  switch (op) {
    case OpType::kAllreduce: d.fusion_signature = "sum"; break;
    case OpType::kBroadcast:
      d.root = 0;
      d.fusion_signature = "root0";
      break;
    default: break;
  }
  return d;
}

Descriptor Allreduce(const std::string& name, std::vector<int64_t> shape = {4},
                     DType dtype = DType::kFloat32) {
  return Make(OpType::kAllreduce, name, std::move(shape), dtype);
}

Descriptor WithRank(Descriptor d, int rank) {
  d.rank = rank;
  return d;
}

// Adds `d` once for every rank 0..size-1.
void AddAll(Coordinator* c, const Descriptor& d, int size, int64_t now = 0) {
  for (int r = 0; r < size; ++r) c->Add(WithRank(d, r), now);
}

std::vector<Keys> KeysOf(const std::vector<Response>& rs) {
  std::vector<Keys> out;
  for (const Response& r : rs) out.push_back(r.keys);
  return out;
}

// The one error response every rank gets for `descriptors` (one per rank, in rank order).
Response SingleError(int size, const std::vector<Descriptor>& descriptors) {
  Coordinator c(size);
  for (size_t r = 0; r < descriptors.size(); ++r) {
    c.Add(WithRank(descriptors[r], static_cast<int>(r)), 0);
  }
  std::vector<Response> rs = c.TakeReady(1 << 20);
  EXPECT_EQ(rs.size(), 1u);
  if (rs.size() != 1) return Response();
  EXPECT_EQ(rs[0].error_code, kInvalidArgumentCode) << rs[0].error_message;
  EXPECT_TRUE(rs[0].ranks.empty());
  EXPECT_EQ(rs[0].keys, Keys{descriptors[0].key});
  EXPECT_TRUE(rs[0].first_dims.empty());
  EXPECT_EQ(c.pending(), 0u);
  return rs[0];
}

std::string ErrorMessage(int size, const std::vector<Descriptor>& descriptors) {
  return SingleError(size, descriptors).error_message;
}

// The responses for descriptors that should agree (one per rank, in rank order).
std::vector<Response> RunAgreeing(const std::vector<Descriptor>& descriptors) {
  Coordinator c(static_cast<int>(descriptors.size()));
  for (size_t r = 0; r < descriptors.size(); ++r) {
    c.Add(WithRank(descriptors[r], static_cast<int>(r)), 0);
  }
  return c.TakeReady(1 << 20);
}

void ExpectOkSingle(const std::vector<Response>& rs, const std::string& key) {
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].error_code, 0) << rs[0].error_message;
  EXPECT_EQ(rs[0].error_message, "");
  EXPECT_EQ(rs[0].keys, Keys{key});
  EXPECT_TRUE(rs[0].ranks.empty());
}

// ---------------------------------------------------------------------------------------
// Wire format

Descriptor FullDescriptor() {
  Descriptor d;
  d.rank = 3;
  d.op = OpType::kHierarchicalNeighborAllreduce;
  d.key = "grad.layer1.weight";
  d.display = "hierarchical_neighbor_allreduce 'grad.layer1.weight'";
  d.dtype = DType::kBFloat16;
  d.device = Device::CUDA(2);
  d.shape = {4, 0, 7, 1LL << 40};
  d.root = 5;
  d.average = true;
  d.in_place = true;
  d.send_ranks = {1, 2, -7};
  d.recv_ranks = {3, 2147483647};
  d.machine = 6;
  d.local_rank = 2;
  d.fusion_signature = std::string("hnar|0.5|\0|bin", 14);
  d.fingerprint = 0xDEADBEEFCAFEF00DULL;
  d.in_flight = -1234567890123LL;
  d.group = {0, 3, 9};
  d.shape_from_peer = true;
  return d;
}

void ExpectSameDescriptor(const Descriptor& a, const Descriptor& b) {
  EXPECT_EQ(a.rank, b.rank);
  EXPECT_EQ(a.op, b.op);
  EXPECT_EQ(a.key, b.key);
  EXPECT_EQ(a.display, b.display);
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.device.type, b.device.type);
  EXPECT_EQ(a.device.index, b.device.index);
  EXPECT_EQ(a.shape, b.shape);
  EXPECT_EQ(a.root, b.root);
  EXPECT_EQ(a.average, b.average);
  EXPECT_EQ(a.in_place, b.in_place);
  EXPECT_EQ(a.send_ranks, b.send_ranks);
  EXPECT_EQ(a.recv_ranks, b.recv_ranks);
  EXPECT_EQ(a.machine, b.machine);
  EXPECT_EQ(a.local_rank, b.local_rank);
  EXPECT_EQ(a.fusion_signature, b.fusion_signature);
  EXPECT_EQ(a.fingerprint, b.fingerprint);
  EXPECT_EQ(a.in_flight, b.in_flight);
  EXPECT_EQ(a.group, b.group);
  EXPECT_EQ(a.shape_from_peer, b.shape_from_peer);
}

TEST(ProtocolTest, DescriptorsRoundTripEveryField) {
  Descriptor full = FullDescriptor();
  Descriptor defaults;
  Descriptor other = Make(OpType::kSetTopology, "#17");
  other.rank = 1;
  other.dtype = DType::kUInt8;
  other.device = Device::CUDA(0);
  other.average = false;
  other.shape = {};
  other.fingerprint = 42;
  other.in_flight = 3;
  const std::vector<Descriptor> in = {full, defaults, other};
  const std::string bytes = SerializeDescriptors(in);
  auto out = ParseDescriptors(bytes);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 3u);
  for (size_t i = 0; i < in.size(); ++i) {
    SCOPED_TRACE(i);
    ExpectSameDescriptor((*out)[i], in[i]);
  }
  // The fields really carried the values (not just defaults on both sides).
  EXPECT_EQ((*out)[0].fusion_signature.size(), 14u);
  EXPECT_EQ((*out)[0].device, Device::CUDA(2));
  EXPECT_EQ((*out)[0].shape[3], 1LL << 40);
  EXPECT_EQ((*out)[2].key, "#17");
  EXPECT_EQ((*out)[2].op, OpType::kSetTopology);
}

TEST(ProtocolTest, EveryOpAndDTypeRoundTrips) {
  std::vector<Descriptor> in;
  for (int op = 0; op <= static_cast<int>(OpType::kSendRecv); ++op) {
    if (op == static_cast<int>(OpType::kWinLocal)) continue;  // never travels
    for (int dtype = 0; dtype < kNumDTypes; ++dtype) {
      Descriptor d;
      d.rank = op * 100 + dtype;
      d.op = static_cast<OpType>(op);
      d.dtype = static_cast<DType>(dtype);
      d.key = absl::StrCat("k", op, ".", dtype);
      in.push_back(d);
    }
  }
  auto out = ParseDescriptors(SerializeDescriptors(in));
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) ExpectSameDescriptor((*out)[i], in[i]);
}

TEST(ProtocolTest, EmptyBatchesRoundTrip) {
  auto ds = ParseDescriptors(SerializeDescriptors(std::vector<Descriptor>{}));
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_TRUE(ds->empty());
  EXPECT_EQ(SerializeDescriptors(std::vector<Descriptor>{}).size(), 4u);
  auto rs = ParseResponses(SerializeResponses({}));
  ASSERT_TRUE(rs.ok()) << rs.status();
  EXPECT_TRUE(rs->empty());
}

TEST(ProtocolTest, ManyMinimalItemsParse) {
  // The smallest items: the parsers' bounds on counts must not reject them. Equal
  // descriptors after the first travel as repeats (rank, marker, empty key: 9 bytes).
  const std::vector<Descriptor> ds(1000);
  const std::string d_bytes = SerializeDescriptors(ds);
  EXPECT_EQ(d_bytes.size(), 4u + 78u + 999u * 9u);
  auto d_out = ParseDescriptors(d_bytes);
  ASSERT_TRUE(d_out.ok()) << d_out.status();
  EXPECT_EQ(d_out->size(), 1000u);
  const std::vector<Response> rs(1000);
  const std::string r_bytes = SerializeResponses(rs);
  EXPECT_EQ(r_bytes.size(), 4u + 1000u * 22u);
  auto r_out = ParseResponses(r_bytes);
  ASSERT_TRUE(r_out.ok()) << r_out.status();
  EXPECT_EQ(r_out->size(), 1000u);
  // Many empty keys and empty first_dims lists.
  Response r;
  r.keys.assign(500, "");
  r.first_dims.assign(300, {});
  auto one = ParseResponses(SerializeResponses({r}));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ((*one)[0].keys.size(), 500u);
  EXPECT_EQ((*one)[0].first_dims.size(), 300u);
}

std::vector<Response> SampleResponses() {
  Response fused;
  fused.op = OpType::kAllreduce;
  fused.keys = {"a", "b", "#12"};
  Response lone;
  lone.op = OpType::kAllreduce;
  lone.keys = {"x"};
  lone.out_of_place = true;
  Response gathered;
  gathered.op = OpType::kNeighborAllgather;
  gathered.keys = {"ag"};
  gathered.first_dims = {{3, 0, 1LL << 35}, {}};
  Response error;
  error.op = OpType::kShutdown;
  error.keys = {""};
  error.error_code = kDeadlineExceededCode;
  error.error_message = std::string("timed out\n\0 after 30 s", 22);
  error.ranks = {0, 2, 7};
  return {fused, gathered, error, Response(), lone};
}

TEST(ProtocolTest, ResponsesRoundTripEveryField) {
  const std::vector<Response> in = SampleResponses();
  auto out = ParseResponses(SerializeResponses(in));
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ((*out)[i].op, in[i].op);
    EXPECT_EQ((*out)[i].keys, in[i].keys);
    EXPECT_EQ((*out)[i].error_code, in[i].error_code);
    EXPECT_EQ((*out)[i].error_message, in[i].error_message);
    EXPECT_EQ((*out)[i].first_dims, in[i].first_dims);
    EXPECT_EQ((*out)[i].ranks, in[i].ranks);
    EXPECT_EQ((*out)[i].out_of_place, in[i].out_of_place);
  }
  EXPECT_TRUE((*out)[4].out_of_place);
  EXPECT_EQ((*out)[1].first_dims[0][2], 1LL << 35);
  EXPECT_EQ((*out)[2].error_message.size(), 22u);
  EXPECT_EQ((*out)[2].ranks, (std::vector<int32_t>{0, 2, 7}));
  EXPECT_EQ((*out)[2].op, OpType::kShutdown);
}

TEST(ProtocolTest, ResponseStatus) {
  Response ok;
  EXPECT_TRUE(ok.status().ok());
  Response bad;
  bad.error_code = kDeadlineExceededCode;
  bad.error_message = "too slow";
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(bad.status().message(), "too slow");
  bad.error_code = kInvalidArgumentCode;
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

// A burst of like unnamed ops (the gradients of one model): the first descriptor in full,
// then one count for all the ops numbered on from it, whatever their number. Like ops that
// are not numbered in a row (named ones, or a gap) travel as repeats, each with its key.
TEST(ProtocolTest, LikeDescriptorsTravelAsOneRun) {
  std::vector<Descriptor> in;
  for (int i = 0; i < 64; ++i) {
    Descriptor d = FullDescriptor();
    d.key = absl::StrCat("#", 1000 + i, "@0,3,9");
    in.push_back(d);
  }
  const std::string one = SerializeDescriptors({in[0]});
  // The first in full, then rank, marker and count.
  const std::string bytes = SerializeDescriptors(in);
  EXPECT_EQ(bytes.size(), one.size() + 4u + 1u + 4u);
  // Named ops, and a gap in the numbers: rank, marker and key each.
  std::vector<Descriptor> named = in;
  named[1].key = "w";
  named[2].key = "b";
  for (size_t i = 4; i < named.size(); ++i) named[i].key = absl::StrCat("#", 1196 + i, "@0,3,9");
  const std::string repeats = SerializeDescriptors(named);
  EXPECT_EQ(repeats.size(), one.size() + 9u + 1u + 9u + 1u + (9u + 11u) /* #1003 */ +
                                (9u + 11u) /* #1200 */ + 9u /* the run of #1201.. */);
  // The engine also gives unnamed ops their number beside the key, which spares parsing the
  // keys: the batches come out the same, byte for byte.
  for (const std::vector<Descriptor>& batch : {in, named}) {
    std::vector<Descriptor> numbered = batch;
    for (Descriptor& d : numbered) {
      absl::string_view scope;
      if (!ParseUnnamedKey(d.key, &d.number, &scope)) d.number = -1;
    }
    EXPECT_EQ(SerializeDescriptors(numbered), SerializeDescriptors(batch));
    std::vector<const Descriptor*> a, b;
    for (const Descriptor& d : numbered) a.push_back(&d);
    for (const Descriptor& d : batch) b.push_back(&d);
    const std::vector<KeyedDescriptor> shared_a = ShareRepeats(a), shared_b = ShareRepeats(b);
    ASSERT_EQ(shared_a.size(), shared_b.size());
    for (size_t i = 0; i < shared_a.size(); ++i) {
      EXPECT_EQ(shared_a[i].key, shared_b[i].key);
      EXPECT_EQ(shared_a[i].count, shared_b[i].count);
    }
  }
  for (const std::vector<Descriptor>& expected : {in, named}) {
    auto out = ParseDescriptors(SerializeDescriptors(expected));
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      SCOPED_TRACE(i);
      ExpectSameDescriptor((*out)[i], expected[i]);
    }
  }
}

// The coordinator's reading of a batch: each run of like unnamed ops numbered in a row as
// one KeyedDescriptor with its count, like ops that are not in a row sharing one
// descriptor; and rank 0's own descriptors read the same way.
TEST(ProtocolTest, KeyedDescriptorsShareEachRunOfRepeats) {
  Descriptor a = FullDescriptor();
  a.group.clear();
  Descriptor b = a;
  b.shape = {7};
  std::vector<Descriptor> in;
  for (const char* key : {"#1", "#2", "#3"}) {
    in.push_back(a);
    in.back().key = key;
  }
  for (const char* key : {"#4", "#5"}) {
    in.push_back(b);
    in.back().key = key;
  }
  in.push_back(a);  // like the first run again: a new run
  in.back().key = "#6";
  for (const char* key : {"x", "y", "#7", "#9"}) {  // like ops, not numbered in a row
    in.push_back(a);
    in.back().key = key;
  }
  std::vector<const Descriptor*> ptrs;
  for (const Descriptor& d : in) ptrs.push_back(&d);
  auto parsed = ParseKeyedDescriptors(SerializeDescriptors(in));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const std::vector<std::pair<std::string, int64_t>> want = {
      {"#1", 3}, {"#4", 2}, {"#6", 1}, {"x", 1}, {"y", 1}, {"#7", 1}, {"#9", 1}};
  const std::vector<size_t> first_op = {0, 3, 5, 6, 7, 8, 9};
  for (const std::vector<KeyedDescriptor>& keyed : {*parsed, ShareRepeats(ptrs)}) {
    ASSERT_EQ(keyed.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      SCOPED_TRACE(i);
      EXPECT_EQ(keyed[i].key, want[i].first);
      EXPECT_EQ(keyed[i].count, want[i].second);
      Descriptor own = *keyed[i].desc;
      own.key = keyed[i].key;
      ExpectSameDescriptor(own, in[first_op[i]]);
    }
    EXPECT_NE(keyed[0].desc, keyed[1].desc);
    EXPECT_NE(keyed[1].desc, keyed[2].desc);
    EXPECT_NE(keyed[0].desc, keyed[2].desc);
    for (size_t i = 3; i < keyed.size(); ++i) EXPECT_EQ(keyed[2].desc, keyed[i].desc);
    EXPECT_EQ(keyed[0].desc->key, "#1");
    EXPECT_EQ(keyed[1].desc->key, "#4");
  }
}

// A descriptor that differs from the one before it in anything but the key is sent in
// full: each field changed alone must arrive changed.
TEST(ProtocolTest, DescriptorsDifferingInOneFieldTravelInFull) {
  const Descriptor base = FullDescriptor();
  std::vector<std::function<void(Descriptor&)>> changes = {
      [](Descriptor& d) { d.op = OpType::kAllreduce; },
      [](Descriptor& d) { d.display = "other"; },
      [](Descriptor& d) { d.dtype = DType::kFloat32; },
      [](Descriptor& d) { d.device = Device::CUDA(3); },
      [](Descriptor& d) { d.device = Device::CPU(); },
      [](Descriptor& d) { d.shape[1] = 1; },
      [](Descriptor& d) { d.shape.push_back(2); },
      [](Descriptor& d) { d.root = 4; },
      [](Descriptor& d) { d.average = false; },
      [](Descriptor& d) { d.in_place = false; },
      [](Descriptor& d) {
        d.send_ranks = {1, 2};
      },
      [](Descriptor& d) {
        d.recv_ranks = {3, 2};
      },
      [](Descriptor& d) { d.machine = 7; },
      [](Descriptor& d) { d.local_rank = 0; },
      [](Descriptor& d) { d.fusion_signature = "hnar|0.25"; },
      [](Descriptor& d) { d.fingerprint = 1; },
      [](Descriptor& d) { d.in_flight = 0; },
      [](Descriptor& d) {
        d.group = {0, 3};
      },
      [](Descriptor& d) { d.shape_from_peer = false; },
      [](Descriptor& d) { d.refused_code = kInvalidArgumentCode; },
      [](Descriptor& d) { d.refused_message = "no"; },
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    SCOPED_TRACE(i);
    Descriptor changed = base;
    changed.key = "next";
    changes[i](changed);
    Descriptor same_again = changed;  // a repeat of the changed one
    same_again.key = "after";
    auto out = ParseDescriptors(SerializeDescriptors({base, changed, same_again}));
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->size(), 3u);
    ExpectSameDescriptor((*out)[0], base);
    ExpectSameDescriptor((*out)[1], changed);
    ExpectSameDescriptor((*out)[2], same_again);
  }
  // A descriptor of another rank is not a repeat either (a rank's batch holds only its own,
  // but the encoding must not depend on that).
  Descriptor other_rank = base;
  other_rank.rank = 4;
  auto out = ParseDescriptors(SerializeDescriptors({base, other_rank}));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ((*out)[1].rank, 4);
}

TEST(ProtocolTest, MalformedRepeatsAreErrors) {
  Descriptor d = FullDescriptor();
  Descriptor again = d;
  again.key = "k2";
  const std::string good = SerializeDescriptors({d, again});
  const std::string first = SerializeDescriptors({d});
  ASSERT_TRUE(ParseDescriptors(good).ok());
  // The repeat alone, as the batch's first item: nothing to repeat.
  std::string orphan = std::string("\x01\0\0\0", 4) + good.substr(first.size());
  auto out = ParseDescriptors(orphan);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("repeat of nothing"), std::string::npos) << out.status();
  // A repeat that names another rank than the descriptor it repeats.
  std::string other_rank = good;
  other_rank[first.size()] = 5;
  out = ParseDescriptors(other_rank);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInternal);
}

TEST(ProtocolTest, UnnamedKeysAreWrittenAndReadBack) {
  for (int64_t number :
       {int64_t{0}, int64_t{7}, int64_t{10}, int64_t{123456789}, int64_t{999999999999999999}}) {
    for (const std::string scope : {"", "@0,2", "@1,2,3,4,5,6,7,8,9,10"}) {
      const std::string key = UnnamedKey(number, scope);
      EXPECT_EQ(key, absl::StrCat("#", number, scope));
      int64_t read = -1;
      absl::string_view read_scope;
      ASSERT_TRUE(ParseUnnamedKey(key, &read, &read_scope)) << key;
      EXPECT_EQ(read, number);
      EXPECT_EQ(read_scope, scope);
      EXPECT_TRUE(IsUnnamedKey(key));
    }
  }
  EXPECT_TRUE(IsNextUnnamedKey("#9@0,2", "#10@0,2"));
  EXPECT_FALSE(IsNextUnnamedKey("#9@0,2", "#10"));
  EXPECT_FALSE(IsNextUnnamedKey("#9", "#11"));
  EXPECT_FALSE(IsNextUnnamedKey("w", "#1"));
  int64_t n = 0;
  absl::string_view scope;
  for (const char* other :
       {"", "#", "w", "#shutdown", "#1x", "#-1", "#12a@0", "@0", "#1234567890123456789"}) {
    EXPECT_FALSE(ParseUnnamedKey(other, &n, &scope)) << other;
  }
}

TEST(ProtocolTest, MalformedRunsAreErrors) {
  Descriptor d = FullDescriptor();
  d.key = "#5@0,3,9";
  Descriptor next = d;
  next.key = "#6@0,3,9";
  const std::string good = SerializeDescriptors({d, next});
  const std::string first = SerializeDescriptors({d});
  ASSERT_EQ(good.size(), first.size() + 9);
  auto out = ParseDescriptors(good);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->size(), 2u);
  EXPECT_EQ((*out)[1].key, "#6@0,3,9");
  const auto expect_error = [](const std::string& bytes, const std::string& what) {
    auto parsed = ParseDescriptors(bytes);
    ASSERT_FALSE(parsed.ok()) << what;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInternal);
    EXPECT_NE(parsed.status().message().find(what), std::string::npos) << parsed.status();
  };
  // The run alone, as the batch's first item.
  expect_error(std::string("\x01\0\0\0", 4) + good.substr(first.size()), "run of nothing");
  // From another rank than the descriptor it continues.
  std::string other_rank = good;
  other_rank[first.size()] = 5;
  expect_error(other_rank, "a run of rank 3's descriptor from rank 5");
  // Of no op, or of more than a batch could hold.
  std::string empty = good;
  empty.replace(good.size() - 4, 4, std::string(4, '\0'));
  expect_error(empty, "a run of 0 more");
  std::string huge = good;
  huge.replace(good.size() - 4, 4, "\xff\xff\xff\x7f");
  expect_error(huge, "a run of 2147483647 more");
  // After a named op: no numbers to go on from.
  Descriptor named = d;
  named.key = "w";
  const std::string named_first = SerializeDescriptors({named});
  std::string after_named = named_first + good.substr(first.size());
  after_named[0] = 2;  // two items
  expect_error(after_named, "a run after 'w', which is not an unnamed op");
}

TEST(ProtocolTest, TruncatedDescriptorsAreErrors) {
  Descriptor again = FullDescriptor();
  again.key = "again";
  Descriptor numbered = again, next = again;  // a run
  numbered.key = "#1";
  next.key = "#2";
  const std::string bytes =
      SerializeDescriptors({FullDescriptor(), again, Descriptor(), numbered, next});
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto out = ParseDescriptors(bytes.substr(0, n));
    EXPECT_FALSE(out.ok()) << "prefix of " << n << " of " << bytes.size() << " bytes";
  }
  auto trailing = ParseDescriptors(bytes + "x");
  ASSERT_FALSE(trailing.ok());
  EXPECT_EQ(trailing.status().code(), absl::StatusCode::kInternal);
}

TEST(ProtocolTest, TruncatedResponsesAreErrors) {
  const std::string bytes = SerializeResponses(SampleResponses());
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto out = ParseResponses(bytes.substr(0, n));
    EXPECT_FALSE(out.ok()) << "prefix of " << n << " of " << bytes.size() << " bytes";
  }
  auto trailing = ParseResponses(bytes + std::string(1, '\0'));
  ASSERT_FALSE(trailing.ok());
  EXPECT_EQ(trailing.status().code(), absl::StatusCode::kInternal);
}

TEST(ProtocolTest, OutOfRangeEnumsAreErrors) {
  Descriptor d;
  d.key = "k";
  d.display = "d";
  const std::string good = SerializeDescriptors({d});
  ASSERT_TRUE(ParseDescriptors(good).ok());
  // Layout: count (4), rank (4), op (1), key (4 + 1), display (4 + 1), dtype (1),
  // device type (1), ...
  const size_t op_at = 8, dtype_at = 8 + 1 + 5 + 5, device_at = dtype_at + 1;
  std::string bad_op = good;
  bad_op[op_at] = static_cast<char>(static_cast<int>(OpType::kSendRecv) + 1);
  EXPECT_FALSE(ParseDescriptors(bad_op).ok());
  bad_op[op_at] = static_cast<char>(OpType::kWinLocal);  // never travels
  EXPECT_FALSE(ParseDescriptors(bad_op).ok());
  std::string bad_dtype = good;
  bad_dtype[dtype_at] = static_cast<char>(kNumDTypes);
  EXPECT_FALSE(ParseDescriptors(bad_dtype).ok());
  std::string bad_device = good;
  bad_device[device_at] = 2;
  EXPECT_FALSE(ParseDescriptors(bad_device).ok());

  const std::string response = SerializeResponses({Response()});
  ASSERT_TRUE(ParseResponses(response).ok());
  std::string bad_response_op = response;
  bad_response_op[4] = static_cast<char>(200);
  EXPECT_FALSE(ParseResponses(bad_response_op).ok());
}

TEST(ProtocolTest, HugeCountsAreErrorsNotAllocations) {
  // A count claims billions of items in a few bytes: an error, not an allocation of
  // hundreds of gigabytes.
  const std::string all_ones(64, '\xff');
  EXPECT_FALSE(ParseDescriptors(all_ones).ok());
  EXPECT_FALSE(ParseResponses(all_ones).ok());
  EXPECT_FALSE(ParseDescriptors(std::string("\xff\xff\xff\x7f", 4)).ok());
  EXPECT_FALSE(ParseResponses(std::string("\xff\xff\xff\x7f", 4)).ok());

  // One response whose key count is huge.
  std::string keys_bomb = SerializeResponses({Response()});
  keys_bomb.replace(5, 4, std::string("\xff\xff\xff\xff", 4));
  EXPECT_FALSE(ParseResponses(keys_bomb).ok());
  // One response whose first_dims count is huge: count 4, op 1, nkeys 4, code 4, msg 4.
  std::string dims_bomb = SerializeResponses({Response()});
  dims_bomb.replace(4 + 1 + 4 + 4 + 4, 4, std::string("\xff\xff\xff\xff", 4));
  EXPECT_FALSE(ParseResponses(dims_bomb).ok());
  // Vectors and strings with huge lengths.
  Descriptor d;
  std::string shape_bomb = SerializeDescriptors({d});
  // count 4, rank 4, op 1, key 4, display 4, dtype 1, device 1 + 4 -> shape length.
  shape_bomb.replace(4 + 4 + 1 + 4 + 4 + 1 + 1 + 4, 4, std::string("\xff\xff\xff\xff", 4));
  EXPECT_FALSE(ParseDescriptors(shape_bomb).ok());
  std::string key_bomb = SerializeDescriptors({d});
  key_bomb.replace(9, 4, std::string("\xff\xff\xff\xff", 4));
  EXPECT_FALSE(ParseDescriptors(key_bomb).ok());
}

TEST(ProtocolTest, RandomGarbageNeverCrashes) {
  std::mt19937 rng(1234);
  Descriptor repeat = FullDescriptor();
  repeat.key = "repeat";
  const std::string good_d = SerializeDescriptors({FullDescriptor(), repeat, Descriptor()});
  const std::string good_r = SerializeResponses(SampleResponses());
  int rejected = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string bytes;
    if (trial % 3 == 0) {  // pure noise
      bytes.resize(rng() % 200);
      for (char& c : bytes) c = static_cast<char>(rng());
    } else {  // valid message with a few bytes flipped
      bytes = trial % 3 == 1 ? good_d : good_r;
      for (int k = 0; k < 3; ++k) bytes[rng() % bytes.size()] = static_cast<char>(rng());
    }
    auto d = ParseDescriptors(bytes);
    auto r = ParseResponses(bytes);
    if (d.ok()) {
      for (const Descriptor& x : *d) {
        EXPECT_LE(static_cast<int>(x.op), static_cast<int>(OpType::kShutdown));
        EXPECT_LT(static_cast<int>(x.dtype), kNumDTypes);
      }
    }
    if (r.ok()) {
      for (const Response& x : *r) {
        EXPECT_LE(static_cast<int>(x.op), static_cast<int>(OpType::kShutdown));
      }
    }
    rejected += !d.ok() + !r.ok();
  }
  EXPECT_GT(rejected, 3000);
}

// ---------------------------------------------------------------------------------------
// Readiness

TEST(ProtocolTest, DescribeNamesTheOpFromItsKey) {
  Descriptor d;
  d.op = OpType::kAllgather;
  EXPECT_EQ(Describe(d), "allgather");  // not numbered yet
  d.key = "#7";
  EXPECT_EQ(Describe(d), "unnamed allgather #7");
  d.group = {0, 2, 3};
  d.key.clear();
  EXPECT_EQ(Describe(d), "allgather over ranks 0, 2-3");
  d.key = "#7@0,2,3";
  EXPECT_EQ(Describe(d), "unnamed allgather #7 over ranks 0, 2-3");
  // A name that itself ends like a scope loses only the scope the engine appended.
  d.key = "g@0,2,3@0,2,3";
  EXPECT_EQ(Describe(d), "allgather 'g@0,2,3' over ranks 0, 2-3");
  d.group.clear();
  d.key = "grad.w";
  EXPECT_EQ(Describe(d), "allgather 'grad.w'");
  d.key = "#shutdown";
  d.op = OpType::kShutdown;
  EXPECT_EQ(Describe(d), "shutdown");

  Descriptor p2p;
  p2p.op = OpType::kSendRecv;
  p2p.group = {1, 4};
  p2p.send_ranks = {4};
  p2p.key = "x@1,4";
  EXPECT_EQ(Describe(p2p), "send 'x' to rank 4");
  p2p.send_ranks.clear();
  p2p.recv_ranks = {1};
  p2p.key = "#0@1,4";
  EXPECT_EQ(Describe(p2p), "unnamed recv #0 from rank 1");

  p2p.display = "win_put 'w'";  // set by the op: used as is
  EXPECT_EQ(Describe(p2p), "win_put 'w'");
}

TEST(CoordinatorTest, NothingReadyUntilEveryRankAdded) {
  for (int size : {1, 3, 4}) {
    SCOPED_TRACE(size);
    Coordinator c(size);
    const Descriptor d = Allreduce("grad");
    for (int r = size - 1; r > 0; --r) {  // every rank but 0, in reverse order
      c.Add(WithRank(d, r), 10 * r);
      EXPECT_TRUE(c.TakeReady(1 << 20).empty());
      EXPECT_EQ(c.pending(), 1u);
    }
    c.Add(WithRank(d, 0), 100);
    EXPECT_EQ(c.pending(), 0u);
    std::vector<Response> rs = c.TakeReady(1 << 20);
    ExpectOkSingle(rs, "grad");
    EXPECT_EQ(rs[0].op, OpType::kAllreduce);
    EXPECT_TRUE(rs[0].first_dims.empty());
    EXPECT_TRUE(c.TakeReady(1 << 20).empty());
  }
}

TEST(CoordinatorTest, AProcessSetsOpIsReadyWhenItsMembersAdded) {
  Coordinator c(4);
  Descriptor d = Allreduce("g@1,3");
  d.group = {1, 3};
  c.Add(WithRank(d, 3), 0);
  EXPECT_TRUE(c.TakeReady(0).empty());
  c.Add(WithRank(d, 1), 0);
  std::vector<Response> rs = c.TakeReady(0);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].error_code, 0) << rs[0].error_message;
  EXPECT_EQ(rs[0].ranks, (std::vector<int32_t>{1, 3}));  // the others skip it
}

TEST(CoordinatorTest, AProcessSetsStallNamesOnlyItsMembers) {
  Coordinator c(4);
  Descriptor d = Allreduce("g@0,2");
  d.group = {0, 2};
  c.Add(WithRank(d, 0), 0);
  auto report = c.CheckStalls(3'000'000, 1, 2);
  ASSERT_EQ(report.errors.size(), 1u);
  EXPECT_NE(report.errors[0].error_message.find("waiting for rank 2"), std::string::npos)
      << report.errors[0].error_message;
  EXPECT_EQ(report.errors[0].ranks, (std::vector<int32_t>{0}));
}

TEST(CoordinatorTest, SendRecvPassesTheSendersShapeAndChecksTheReceivers) {
  Descriptor send = Make(OpType::kSendRecv, "act@0,1", {2, 3}, DType::kFloat64);
  send.group = {0, 1};
  send.send_ranks = {1};
  Descriptor recv = send;
  recv.send_ranks.clear();
  recv.recv_ranks = {0};
  recv.shape_from_peer = true;  // an Allocator: any dtype and shape
  recv.shape.clear();
  recv.dtype = DType::kFloat32;
  {
    Coordinator c(2);
    c.Add(WithRank(send, 0), 0);
    c.Add(WithRank(recv, 1), 0);
    std::vector<Response> rs = c.TakeReady(0);
    ASSERT_EQ(rs.size(), 1u);
    EXPECT_EQ(rs[0].error_code, 0) << rs[0].error_message;
    ASSERT_EQ(rs[0].first_dims.size(), 2u);
    EXPECT_EQ(rs[0].first_dims[0], (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(rs[0].first_dims[1], (std::vector<int64_t>{static_cast<int64_t>(DType::kFloat64)}));
  }
  {
    Coordinator c(2);
    recv.shape_from_peer = false;
    recv.shape = {3, 2};
    recv.dtype = DType::kFloat64;
    c.Add(WithRank(send, 0), 0);
    c.Add(WithRank(recv, 1), 0);
    std::vector<Response> rs = c.TakeReady(0);
    ASSERT_EQ(rs.size(), 1u);
    EXPECT_NE(rs[0].error_message.find("does not have the sent shape"), std::string::npos)
        << rs[0].error_message;
    EXPECT_EQ(rs[0].ranks, (std::vector<int32_t>{0, 1}));
  }
  {
    Coordinator c(3);  // both ranks receive: nobody sends
    Descriptor other = recv;
    other.recv_ranks = {1};
    other.shape = {2, 3};
    recv.shape = {2, 3};
    c.Add(WithRank(recv, 1), 0);
    c.Add(WithRank(other, 0), 0);
    std::vector<Response> rs = c.TakeReady(0);
    ASSERT_EQ(rs.size(), 1u);
    EXPECT_NE(rs[0].error_message.find("do not match"), std::string::npos)
        << rs[0].error_message;
  }
}

TEST(CoordinatorTest, ReadyInTheOrderKeysCompleted) {
  Coordinator c(3);
  // Started in order a, b, c, d; completed in order c, a, d, b.
  for (const char* k : {"a", "b", "c", "d"}) c.Add(WithRank(Make(OpType::kBarrier, k, {}), 0), 0);
  for (const char* k : {"a", "b", "c", "d"}) c.Add(WithRank(Make(OpType::kBarrier, k, {}), 1), 0);
  c.Add(WithRank(Make(OpType::kBarrier, "c", {}), 2), 0);
  c.Add(WithRank(Make(OpType::kBarrier, "a", {}), 2), 0);
  EXPECT_EQ(c.pending(), 2u);
  c.Add(WithRank(Make(OpType::kBarrier, "d", {}), 2), 0);
  c.Add(WithRank(Make(OpType::kBarrier, "b", {}), 2), 0);
  EXPECT_EQ(c.pending(), 0u);
  std::vector<Response> rs = c.TakeReady(1 << 20);
  EXPECT_EQ(KeysOf(rs), (std::vector<Keys>{{"c"}, {"a"}, {"d"}, {"b"}}));
  for (const Response& r : rs) {
    EXPECT_EQ(r.op, OpType::kBarrier);
    EXPECT_EQ(r.error_code, 0);
  }
}

TEST(CoordinatorTest, ResponsesCarryTheOp) {
  for (OpType op : {OpType::kAllreduce, OpType::kBroadcast, OpType::kBarrier,
                    OpType::kShutdown, OpType::kSetTopology}) {
    Coordinator c(2);
    AddAll(&c, Make(op, "x"), 2);
    std::vector<Response> rs = c.TakeReady(1 << 20);
    ExpectOkSingle(rs, "x");
    EXPECT_EQ(rs[0].op, op);
  }
}

TEST(CoordinatorTest, KeyCanBeReusedAfterItCompleted) {
  Coordinator c(2);
  AddAll(&c, Allreduce("g"), 2);
  ExpectOkSingle(c.TakeReady(0), "g");
  c.Add(WithRank(Allreduce("g"), 1), 0);
  EXPECT_TRUE(c.TakeReady(0).empty());
  EXPECT_EQ(c.pending(), 1u);
  c.Add(WithRank(Allreduce("g"), 0), 0);
  ExpectOkSingle(c.TakeReady(0), "g");
}

// ---------------------------------------------------------------------------------------
// Agreement

TEST(CoordinatorTest, ShapeMismatch) {
  Descriptor four = Allreduce("grad", {4});
  Descriptor five = Allreduce("grad", {5});
  const Response r = SingleError(4, {four, four, five, four});
  EXPECT_EQ(r.op, OpType::kAllreduce);
  EXPECT_EQ(r.error_message,
            "allreduce 'grad': shape differs across ranks: [4] on ranks 0-1, 3; [5] on rank 2");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrorMessage(2, {Allreduce("m", {2, 3}), Allreduce("m", {3, 2})}),
            "allreduce 'm': shape differs across ranks: [2, 3] on rank 0; [3, 2] on rank 1");
  EXPECT_EQ(ErrorMessage(2, {Allreduce("s", {}), Allreduce("s", {1})}),
            "allreduce 's': shape differs across ranks: [] on rank 0; [1] on rank 1");
}

TEST(CoordinatorTest, DTypeMismatch) {
  EXPECT_EQ(ErrorMessage(3, {Allreduce("w", {4}, DType::kFloat32),
                             Allreduce("w", {4}, DType::kFloat16),
                             Allreduce("w", {4}, DType::kFloat32)}),
            "allreduce 'w': dtype differs across ranks: float32 on ranks 0, 2; float16 on "
            "rank 1");
  // The dtype is reported before the shape.
  EXPECT_EQ(ErrorMessage(2, {Allreduce("w", {4}, DType::kInt64),
                             Allreduce("w", {5}, DType::kInt32)}),
            "allreduce 'w': dtype differs across ranks: int64 on rank 0; int32 on rank 1");
}

TEST(CoordinatorTest, DeviceMismatch) {
  Descriptor cpu = Allreduce("w");
  Descriptor gpu = Allreduce("w");
  gpu.device = Device::CUDA(0);
  Descriptor gpu1 = Allreduce("w");
  gpu1.device = Device::CUDA(1);
  const std::string message = ErrorMessage(3, {cpu, gpu, gpu1});
  EXPECT_EQ(message.rfind("allreduce 'w': device type differs across ranks: cpu on rank 0; "
                          "cuda:",
                          0),
            0u)
      << message;
  // Only the kind of device must agree: with a GPU per process, rank r holds cuda:r.
  ExpectOkSingle(RunAgreeing({gpu, gpu1}), "w");
}

TEST(CoordinatorTest, OpMismatchUnderOneKey) {
  const Response r = SingleError(
      3, {Allreduce("x"), Make(OpType::kBroadcast, "x"), Allreduce("x")});
  EXPECT_EQ(r.error_message,
            "'x': ranks submitted different operations: allreduce on ranks 0, 2; broadcast on "
            "rank 1");
  Descriptor a = Make(OpType::kAllgather, "#7");
  a.display = "unnamed allgather #7";
  Descriptor b = Make(OpType::kBarrier, "#7");
  b.display = "unnamed barrier #7";
  EXPECT_EQ(ErrorMessage(2, {a, b}),
            "unnamed op #7: ranks submitted different operations: allgather on rank 0; "
            "barrier on rank 1");
}

TEST(CoordinatorTest, BroadcastRootMismatch) {
  Descriptor root0 = Make(OpType::kBroadcast, "params");
  Descriptor root1 = root0;
  root1.root = 1;
  const Response r = SingleError(3, {root0, root0, root1});
  EXPECT_EQ(r.op, OpType::kBroadcast);
  EXPECT_EQ(r.error_message,
            "broadcast 'params': root rank differs across ranks: root 0 on ranks 0-1; root 1 "
            "on rank 2");
  ExpectOkSingle(RunAgreeing({root1, root1, root1}), "params");
  // root only matters for broadcast.
  Descriptor g0 = Allreduce("g"), g1 = Allreduce("g");
  g1.root = 3;
  ExpectOkSingle(RunAgreeing({g0, g1}), "g");
}

TEST(CoordinatorTest, AverageMismatch) {
  Descriptor avg = Allreduce("g");
  avg.average = true;
  Descriptor sum = Allreduce("g");
  EXPECT_EQ(ErrorMessage(2, {avg, sum}),
            "allreduce 'g': average/sum differs across ranks: average on rank 0; sum on rank "
            "1");
  ExpectOkSingle(RunAgreeing({avg, avg}), "g");
  // average only matters for allreduce.
  Descriptor b0 = Make(OpType::kBroadcast, "b"), b1 = b0;
  b1.average = true;
  ExpectOkSingle(RunAgreeing({b0, b1}), "b");
}

// Each rank's rows fit, their sum does not: an error on every rank, not a wrapped size.
TEST(CoordinatorTest, AllgatherWhoseResultOverflowsIsAnError) {
  const int64_t rows = int64_t{1} << 60;  // 2^62 bytes of float32 each
  const std::string message = ErrorMessage(
      2, {Make(OpType::kAllgather, "big", {rows, 1}), Make(OpType::kAllgather, "big", {rows, 1})});
  EXPECT_NE(message.find("more than 2^63 bytes"), std::string::npos) << message;
  EXPECT_NE(ErrorMessage(2, {Make(OpType::kAllgather, "row", {1, rows, 8}),
                             Make(OpType::kAllgather, "row", {1, rows, 8})})
                .find("more than 2^63 bytes"),
            std::string::npos);
}

TEST(CoordinatorTest, AllgatherAllowsDifferentFirstDim) {
  std::vector<Response> rs = RunAgreeing({Make(OpType::kAllgather, "ag", {2, 3}),
                                  Make(OpType::kAllgather, "ag", {5, 3}),
                                  Make(OpType::kAllgather, "ag", {0, 3})});
  ExpectOkSingle(rs, "ag");
  EXPECT_EQ(rs[0].op, OpType::kAllgather);
  EXPECT_EQ(rs[0].first_dims, (std::vector<std::vector<int64_t>>{{2, 5, 0}}));

  // Scalars count as one row.
  rs = RunAgreeing({Make(OpType::kAllgather, "s", {}), Make(OpType::kAllgather, "s", {})});
  ExpectOkSingle(rs, "s");
  EXPECT_EQ(rs[0].first_dims, (std::vector<std::vector<int64_t>>{{1, 1}}));

  // Neighbor allgather likewise.
  Descriptor n0 = Make(OpType::kNeighborAllgather, "nag", {7});
  n0.send_ranks = {1};
  n0.recv_ranks = {1};
  Descriptor n1 = Make(OpType::kNeighborAllgather, "nag", {9});
  n1.send_ranks = {0};
  n1.recv_ranks = {0};
  rs = RunAgreeing({n0, n1});
  ExpectOkSingle(rs, "nag");
  EXPECT_EQ(rs[0].first_dims, (std::vector<std::vector<int64_t>>{{7, 9}}));
}

TEST(CoordinatorTest, AllgatherRejectsOtherDims) {
  const Response r = SingleError(3, {Make(OpType::kAllgather, "ag", {2, 3}),
                                     Make(OpType::kAllgather, "ag", {2, 4}),
                                     Make(OpType::kAllgather, "ag", {7, 3})});
  EXPECT_EQ(r.op, OpType::kAllgather);
  EXPECT_EQ(r.error_message,
            "allgather 'ag': shapes must agree in every dimension but the first: [*, 3] on "
            "ranks 0, 2; [*, 4] on rank 1");
  EXPECT_EQ(ErrorMessage(2, {Make(OpType::kAllgather, "ag", {2, 3, 4}),
                             Make(OpType::kAllgather, "ag", {2, 3, 5})}),
            "allgather 'ag': shapes must agree in every dimension but the first: [*, 3, 4] on "
            "rank 0; [*, 3, 5] on rank 1");
}

TEST(CoordinatorTest, ShapeIgnoredForBarrierShutdownSetTopology) {
  for (OpType op : {OpType::kBarrier, OpType::kShutdown, OpType::kSetTopology}) {
    ExpectOkSingle(RunAgreeing({Make(op, "x", {1}), Make(op, "x", {2, 2}), Make(op, "x", {})}), "x");
  }
}

// ---------------------------------------------------------------------------------------
// Point-to-point patterns

Descriptor Pattern(OpType op, const std::string& key, std::vector<int32_t> send,
                   std::vector<int32_t> recv) {
  Descriptor d = Make(op, key);
  d.send_ranks = std::move(send);
  d.recv_ranks = std::move(recv);
  return d;
}

Descriptor Neighbor(std::vector<int32_t> send, std::vector<int32_t> recv) {
  return Pattern(OpType::kNeighborAllreduce, "n", std::move(send), std::move(recv));
}

TEST(CoordinatorTest, ConsistentRingPasses) {
  std::vector<Descriptor> ring, both;
  for (int r = 0; r < 4; ++r) {
    ring.push_back(Neighbor({(r + 1) % 4}, {(r + 3) % 4}));
    both.push_back(Neighbor({(r + 1) % 4, (r + 3) % 4}, {(r + 3) % 4, (r + 1) % 4}));
  }
  std::vector<Response> rs = RunAgreeing(ring);
  ExpectOkSingle(rs, "n");
  EXPECT_EQ(rs[0].op, OpType::kNeighborAllreduce);
  ExpectOkSingle(RunAgreeing(both), "n");
  // No edges at all is consistent too.
  ExpectOkSingle(RunAgreeing({Neighbor({}, {}), Neighbor({}, {})}), "n");
}

TEST(CoordinatorTest, ExpectingFromANonSender) {
  // 0 -> 1 -> 2, and 0 also expects 2, which sends to nobody.
  EXPECT_EQ(ErrorMessage(3, {Neighbor({1}, {2}), Neighbor({2}, {0}), Neighbor({}, {1})}),
            "neighbor_allreduce 'n': send and receive ranks do not match: rank 0 expects to "
            "receive from rank 2, which does not send to it");
}

TEST(CoordinatorTest, SendingToANonExpecter) {
  // Ring 0 -> 1 -> 2 -> 0, and 0 also sends to 2, which does not expect it.
  EXPECT_EQ(ErrorMessage(3, {Neighbor({1, 2}, {2}), Neighbor({2}, {0}), Neighbor({0}, {1})}),
            "neighbor_allreduce 'n': send and receive ranks do not match: rank 0 sends to "
            "rank 2, which does not expect it");
}

TEST(CoordinatorTest, SendingToANonexistentRank) {
  EXPECT_EQ(ErrorMessage(2, {Neighbor({1, 5}, {1}), Neighbor({0}, {0})}),
            "neighbor_allreduce 'n': send and receive ranks do not match: rank 0 sends to "
            "rank 5, which does not exist");
}

TEST(CoordinatorTest, ManyPatternProblemsAreCapped) {
  std::vector<Descriptor> ds;
  for (int r = 0; r < 10; ++r) ds.push_back(Neighbor({}, {(r + 1) % 10}));
  const std::string msg = ErrorMessage(10, ds);
  EXPECT_EQ(msg.rfind("neighbor_allreduce 'n': send and receive ranks do not match: rank 0 "
                      "expects to receive from rank 1, which does not send to it; rank 1 "
                      "expects",
                      0),
            0u)
      << msg;
  EXPECT_NE(msg.find("rank 7 expects to receive from rank 8, which does not send to it "
                     "(and 2 more)"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("rank 8 expects"), std::string::npos) << msg;
}

TEST(CoordinatorTest, PairGossip) {
  auto gossip = [](int peer) {
    return Pattern(OpType::kPairGossip, "pg", {peer}, {peer});
  };
  std::vector<Response> rs = RunAgreeing({gossip(1), gossip(0), gossip(3), gossip(2)});
  ExpectOkSingle(rs, "pg");
  EXPECT_EQ(rs[0].op, OpType::kPairGossip);
  // 0 picks 1, but 1 and 2 pick each other.
  const Response r = SingleError(3, {gossip(1), gossip(2), gossip(1)});
  EXPECT_EQ(r.op, OpType::kPairGossip);
  EXPECT_EQ(r.error_message,
            "pair_gossip 'pg': send and receive ranks do not match: rank 0 expects to receive "
            "from rank 1, which does not send to it; rank 0 sends to rank 1, which does not "
            "expect it");
}

Descriptor Hierarchical(int machine, int local_rank, std::vector<int32_t> send,
                        std::vector<int32_t> recv) {
  Descriptor d = Pattern(OpType::kHierarchicalNeighborAllreduce, "h", std::move(send),
                         std::move(recv));
  d.machine = machine;
  d.local_rank = local_rank;
  return d;
}

TEST(CoordinatorTest, HierarchicalChecksOnlyLocalRankZero) {
  // Two machines of two ranks; the local rank 1 descriptors carry nonsense.
  std::vector<Response> rs = RunAgreeing({Hierarchical(0, 0, {1}, {1}), Hierarchical(0, 1, {7, 9}, {42}),
                                  Hierarchical(1, 0, {0}, {0}), Hierarchical(1, 1, {}, {3})});
  ExpectOkSingle(rs, "h");
  EXPECT_EQ(rs[0].op, OpType::kHierarchicalNeighborAllreduce);
  // Three machines in a ring, local rank 0 not being the first rank of its machine.
  ExpectOkSingle(RunAgreeing({Hierarchical(0, 1, {}, {}), Hierarchical(0, 0, {1}, {2}),
                      Hierarchical(1, 0, {2}, {0}), Hierarchical(2, 0, {0}, {1}),
                      Hierarchical(2, 1, {5}, {5})}),
                 "h");

  const Response r = SingleError(4, {Hierarchical(0, 0, {1}, {1}), Hierarchical(0, 1, {1}, {1}),
                                     Hierarchical(1, 0, {}, {0}), Hierarchical(1, 1, {0}, {0})});
  EXPECT_EQ(r.op, OpType::kHierarchicalNeighborAllreduce);
  EXPECT_EQ(r.error_message,
            "hierarchical_neighbor_allreduce 'h': send and receive ranks do not match: machine "
            "0 expects to receive from machine 1, which does not send to it");
}

// ---------------------------------------------------------------------------------------
// set_topology

Descriptor SetTopology(uint64_t fingerprint, int64_t in_flight = 0) {
  Descriptor d = Make(OpType::kSetTopology, "#5", {});
  d.display = "set_topology";
  d.fingerprint = fingerprint;
  d.in_flight = in_flight;
  return d;
}

TEST(CoordinatorTest, SetTopology) {
  std::vector<Response> rs = RunAgreeing({SetTopology(7), SetTopology(7), SetTopology(7)});
  ExpectOkSingle(rs, "#5");
  EXPECT_EQ(rs[0].op, OpType::kSetTopology);

  const Response r = SingleError(3, {SetTopology(7), SetTopology(7), SetTopology(9)});
  EXPECT_EQ(r.op, OpType::kSetTopology);
  EXPECT_EQ(r.error_message,
            "set_topology: ranks passed topologies that are not equivalent (different edges): "
            "graph #7 on ranks 0-1; graph #9 on rank 2");
}

TEST(CoordinatorTest, SetTopologyWithOpsInFlight) {
  EXPECT_EQ(ErrorMessage(3, {SetTopology(7), SetTopology(7, 2), SetTopology(7)}),
            "set_topology: ops are still in flight on rank 1; wait for them before changing "
            "the topology");
  EXPECT_EQ(ErrorMessage(4, {SetTopology(7, 1), SetTopology(7), SetTopology(7, 5),
                             SetTopology(7, 0)}),
            "set_topology: ops are still in flight on ranks 0, 2; wait for them before "
            "changing the topology");
}

// ---------------------------------------------------------------------------------------
// Fusion

// Adds `ds` in order for every one of `size` ranks, then takes what is ready.
std::vector<Response> AddInOrder(int size, const std::vector<Descriptor>& ds,
                                 int64_t threshold) {
  Coordinator c(size);
  for (int r = 0; r < size; ++r) {
    for (const Descriptor& d : ds) c.Add(WithRank(d, r), 0);
  }
  return c.TakeReady(threshold);
}

std::vector<Descriptor> FourKilobyteGradients() {
  // 250 float32 = 1000 bytes each.
  return {Allreduce("a", {250}), Allreduce("b", {250}), Allreduce("c", {250}),
          Allreduce("d", {250})};
}

TEST(CoordinatorTest, FusionSplitsAtTheThreshold) {
  const auto ds = FourKilobyteGradients();
  EXPECT_EQ(KeysOf(AddInOrder(2, ds, 2500)), (std::vector<Keys>{{"a", "b"}, {"c", "d"}}));
  EXPECT_EQ(KeysOf(AddInOrder(2, ds, 2000)), (std::vector<Keys>{{"a", "b"}, {"c", "d"}}));
  EXPECT_EQ(KeysOf(AddInOrder(2, ds, 1999)), (std::vector<Keys>{{"a"}, {"b"}, {"c"}, {"d"}}));
  EXPECT_EQ(KeysOf(AddInOrder(2, ds, 3000)), (std::vector<Keys>{{"a", "b", "c"}, {"d"}}));
  EXPECT_EQ(KeysOf(AddInOrder(3, ds, 4000)), (std::vector<Keys>{{"a", "b", "c", "d"}}));
  EXPECT_EQ(KeysOf(AddInOrder(1, ds, 1 << 30)), (std::vector<Keys>{{"a", "b", "c", "d"}}));
  std::vector<Response> rs = AddInOrder(2, ds, 2500);
  for (const Response& r : rs) {
    EXPECT_EQ(r.op, OpType::kAllreduce);
    EXPECT_EQ(r.error_code, 0);
    EXPECT_TRUE(r.ranks.empty());
  }
}

TEST(CoordinatorTest, OutOfPlaceOnlyWhenEveryRankIs) {
  Descriptor d = Allreduce("g");
  EXPECT_TRUE(RunAgreeing({d, d, d})[0].out_of_place);
  Descriptor in_place = d;
  in_place.in_place = true;
  EXPECT_FALSE(RunAgreeing({d, in_place, d})[0].out_of_place);
  EXPECT_FALSE(RunAgreeing({in_place, in_place})[0].out_of_place);
  // Only allreduce reads it.
  Descriptor b = Make(OpType::kBroadcast, "b");
  EXPECT_FALSE(RunAgreeing({b, b})[0].out_of_place);
}

TEST(CoordinatorTest, FusionThresholdZeroMeansNoFusion) {
  EXPECT_EQ(KeysOf(AddInOrder(2, FourKilobyteGradients(), 0)),
            (std::vector<Keys>{{"a"}, {"b"}, {"c"}, {"d"}}));
}

TEST(CoordinatorTest, FusionCountsBytesByDType) {
  // float64 [100] = 800 bytes; three of them fit 2400.
  std::vector<Descriptor> ds = {Allreduce("a", {10, 10}, DType::kFloat64),
                                Allreduce("b", {100}, DType::kFloat64),
                                Allreduce("c", {4, 25}, DType::kFloat64),
                                Allreduce("d", {1}, DType::kFloat64)};
  EXPECT_EQ(KeysOf(AddInOrder(2, ds, 2400)), (std::vector<Keys>{{"a", "b", "c"}, {"d"}}));
  EXPECT_EQ(KeysOf(AddInOrder(2, ds, 2399)), (std::vector<Keys>{{"a", "b"}, {"c", "d"}}));
}

TEST(CoordinatorTest, LargeOpStandsAlone) {
  std::vector<Descriptor> ds = {Allreduce("big", {750}), Allreduce("b", {250}),
                                Allreduce("c", {250})};
  EXPECT_EQ(KeysOf(AddInOrder(2, ds, 2500)), (std::vector<Keys>{{"big"}, {"b", "c"}}));
}

TEST(CoordinatorTest, FusionBreaksOnDTypeSignatureOrOp) {
  std::vector<Descriptor> ds = {Allreduce("a"), Allreduce("b", {4}, DType::kFloat64),
                                Allreduce("c"), Allreduce("d")};
  EXPECT_EQ(KeysOf(AddInOrder(2, ds, 1 << 20)), (std::vector<Keys>{{"a"}, {"b"}, {"c", "d"}}));

  Descriptor avg = Allreduce("b");
  avg.average = true;
  avg.fusion_signature = "avg";
  ds = {Allreduce("a"), avg, Allreduce("c"), Allreduce("d")};
  EXPECT_EQ(KeysOf(AddInOrder(2, ds, 1 << 20)), (std::vector<Keys>{{"a"}, {"b"}, {"c", "d"}}));

  ds = {Allreduce("a"), Make(OpType::kBroadcast, "b"), Make(OpType::kBroadcast, "c"),
        Allreduce("d")};
  std::vector<Response> rs = AddInOrder(2, ds, 1 << 20);
  EXPECT_EQ(KeysOf(rs), (std::vector<Keys>{{"a"}, {"b", "c"}, {"d"}}));
  ASSERT_EQ(rs.size(), 3u);
  EXPECT_EQ(rs[1].op, OpType::kBroadcast);

  Descriptor on_gpu = Allreduce("b");
  on_gpu.device = Device::CUDA(0);
  ds = {Allreduce("a"), on_gpu, Allreduce("c")};
  EXPECT_EQ(KeysOf(AddInOrder(2, ds, 1 << 20)), (std::vector<Keys>{{"a"}, {"b"}, {"c"}}));

  // A barrier between two allreduces separates them.
  ds = {Allreduce("a"), Make(OpType::kBarrier, "x", {}), Allreduce("c")};
  EXPECT_EQ(KeysOf(AddInOrder(2, ds, 1 << 20)), (std::vector<Keys>{{"a"}, {"x"}, {"c"}}));
}

TEST(CoordinatorTest, FusionNeedsEqualNonEmptySignatureOnEveryRank) {
  Descriptor a = Allreduce("a"), b = Allreduce("b");
  a.fusion_signature = b.fusion_signature = "";
  EXPECT_EQ(KeysOf(AddInOrder(2, {a, b}, 1 << 20)), (std::vector<Keys>{{"a"}, {"b"}}));

  // Equal on rank 0, different on rank 1.
  Coordinator c(2);
  c.Add(WithRank(Allreduce("a"), 0), 0);
  c.Add(WithRank(Allreduce("b"), 0), 0);
  Descriptor a1 = WithRank(Allreduce("a"), 1), b1 = WithRank(Allreduce("b"), 1);
  a1.fusion_signature = "nar|0.5";
  b1.fusion_signature = "nar|0.25";
  c.Add(a1, 0);
  c.Add(b1, 0);
  EXPECT_EQ(KeysOf(c.TakeReady(1 << 20)), (std::vector<Keys>{{"a"}, {"b"}}));

  // Different per rank but equal across the two ops of each rank: fuses.
  Coordinator c2(2);
  c2.Add(WithRank(Allreduce("a"), 0), 0);
  c2.Add(WithRank(Allreduce("b"), 0), 0);
  b1.fusion_signature = "nar|0.5";
  c2.Add(a1, 0);
  c2.Add(b1, 0);
  EXPECT_EQ(KeysOf(c2.TakeReady(1 << 20)), (std::vector<Keys>{{"a", "b"}}));
}

TEST(CoordinatorTest, AllgatherNeverFuses) {
  Descriptor a = Make(OpType::kAllgather, "a", {2});
  Descriptor b = Make(OpType::kAllgather, "b", {3});
  a.fusion_signature = b.fusion_signature = "gather";
  std::vector<Response> rs = AddInOrder(2, {a, b}, 1 << 20);
  EXPECT_EQ(KeysOf(rs), (std::vector<Keys>{{"a"}, {"b"}}));
  ASSERT_EQ(rs.size(), 2u);
  EXPECT_EQ(rs[0].first_dims, (std::vector<std::vector<int64_t>>{{2, 2}}));
  EXPECT_EQ(rs[1].first_dims, (std::vector<std::vector<int64_t>>{{3, 3}}));
  // Nor does an allreduce fuse into an allgather's group.
  Descriptor c = Allreduce("c");
  c.fusion_signature = "gather";
  EXPECT_EQ(KeysOf(AddInOrder(2, {a, c, Allreduce("d")}, 1 << 20)),
            (std::vector<Keys>{{"a"}, {"c"}, {"d"}}));
}

TEST(CoordinatorTest, ErrorInTheMiddleBreaksTheGroup) {
  Coordinator c(2);
  for (int r = 0; r < 2; ++r) {
    c.Add(WithRank(Allreduce("a"), r), 0);
    c.Add(WithRank(Allreduce("b", {r == 0 ? 4 : 5}), r), 0);
    c.Add(WithRank(Allreduce("c"), r), 0);
    c.Add(WithRank(Allreduce("d"), r), 0);
  }
  std::vector<Response> rs = c.TakeReady(1 << 20);
  EXPECT_EQ(KeysOf(rs), (std::vector<Keys>{{"a"}, {"b"}, {"c", "d"}}));
  ASSERT_EQ(rs.size(), 3u);
  EXPECT_EQ(rs[0].error_code, 0);
  EXPECT_EQ(rs[1].error_code, kInvalidArgumentCode);
  EXPECT_EQ(rs[1].error_message,
            "allreduce 'b': shape differs across ranks: [4] on rank 0; [5] on rank 1");
  EXPECT_TRUE(rs[1].ranks.empty());
  EXPECT_EQ(rs[2].error_code, 0);
}

TEST(CoordinatorTest, FusionOnlyWithinOneTakeReady) {
  Coordinator c(2);
  AddAll(&c, Allreduce("a"), 2);
  EXPECT_EQ(KeysOf(c.TakeReady(1 << 20)), (std::vector<Keys>{{"a"}}));
  AddAll(&c, Allreduce("b"), 2);
  AddAll(&c, Allreduce("c"), 2);
  EXPECT_EQ(KeysOf(c.TakeReady(1 << 20)), (std::vector<Keys>{{"b", "c"}}));
}

// ---------------------------------------------------------------------------------------
// Duplicates

TEST(CoordinatorTest, SameRankTwiceIsAnErrorForThatRank) {
  Coordinator c(3);
  c.Add(WithRank(Allreduce("a"), 1), 0);
  c.Add(WithRank(Allreduce("a"), 1), 0);
  std::vector<Response> rs = c.TakeReady(1 << 20);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].keys, Keys{"a"});
  EXPECT_EQ(rs[0].op, OpType::kAllreduce);
  EXPECT_EQ(rs[0].error_code, kInvalidArgumentCode);
  EXPECT_EQ(rs[0].error_message, "allreduce 'a': rank 1 submitted it twice before it completed");
  EXPECT_EQ(rs[0].ranks, std::vector<int32_t>{1});
  EXPECT_EQ(c.pending(), 1u);
  // The first submission still counts.
  c.Add(WithRank(Allreduce("a"), 0), 0);
  EXPECT_TRUE(c.TakeReady(1 << 20).empty());
  c.Add(WithRank(Allreduce("a"), 2), 0);
  ExpectOkSingle(c.TakeReady(1 << 20), "a");
}

// Bursts as the engine hands them over: each rank's like ops share one descriptor, and
// the coordinator validates such ops once. An op of the burst that differs on one rank
// still fails alone, and is named by its own key.
std::vector<KeyedDescriptor> Burst(const Descriptor& d, int rank, std::vector<std::string> keys) {
  Descriptor first = WithRank(d, rank);
  first.key = keys.front();  // as the engine shares them: the run's first op's
  auto shared = std::make_shared<const Descriptor>(std::move(first));
  std::vector<KeyedDescriptor> out;
  for (std::string& key : keys) out.push_back({std::move(key), shared});
  return out;
}

TEST(CoordinatorTest, SharedDescriptorsAreCheckedForEveryOp) {
  Coordinator c(2);
  Descriptor d = Allreduce("");
  d.display.clear();  // messages name the op from its key
  for (KeyedDescriptor& k : Burst(d, 0, {"#0", "#1", "#2", "#3", "#4"})) c.Add(std::move(k), 0);
  for (KeyedDescriptor& k : Burst(d, 1, {"#0", "#1"})) c.Add(std::move(k), 0);
  Descriptor wider = d;
  wider.shape = {5};
  for (KeyedDescriptor& k : Burst(wider, 1, {"#2"})) c.Add(std::move(k), 0);
  for (KeyedDescriptor& k : Burst(d, 1, {"#3", "#4"})) c.Add(std::move(k), 0);
  std::vector<Response> rs = c.TakeReady(1 << 20);
  ASSERT_EQ(rs.size(), 3u);
  EXPECT_EQ(rs[0].keys, (Keys{"#0", "#1"}));
  EXPECT_EQ(rs[0].error_code, 0) << rs[0].error_message;
  EXPECT_EQ(rs[1].keys, Keys{"#2"});
  EXPECT_EQ(rs[1].error_code, kInvalidArgumentCode);
  EXPECT_EQ(rs[1].error_message,
            "unnamed allreduce #2: shape differs across ranks: [4] on rank 0; [5] on rank 1");
  EXPECT_EQ(rs[2].keys, (Keys{"#3", "#4"}));
  EXPECT_EQ(rs[2].error_code, 0) << rs[2].error_message;
  EXPECT_EQ(c.pending(), 0u);

  // The same shared descriptors in the next round: checked again where they disagree.
  Descriptor average = d;
  average.average = true;
  for (KeyedDescriptor& k : Burst(d, 0, {"#5", "#6"})) c.Add(std::move(k), 0);
  for (KeyedDescriptor& k : Burst(average, 1, {"#5", "#6"})) c.Add(std::move(k), 0);
  rs = c.TakeReady(1 << 20);
  ASSERT_EQ(rs.size(), 2u);
  EXPECT_EQ(rs[0].error_message,
            "unnamed allreduce #5: average/sum differs across ranks: sum on rank 0; average on "
            "rank 1");
  EXPECT_EQ(rs[1].error_message,
            "unnamed allreduce #6: average/sum differs across ranks: sum on rank 0; average on "
            "rank 1");
}

TEST(CoordinatorTest, MessagesNameTheOpOfASharedDescriptorByItsOwnKey) {
  Coordinator c(2);
  Descriptor d = Allreduce("");
  d.display.clear();
  const int64_t t0 = 10 * kSecond;
  for (KeyedDescriptor& k : Burst(d, 0, {"#7", "#8"})) c.Add(std::move(k), t0);
  // #8 again, this time second in its burst (whose descriptor carries #9's key).
  for (KeyedDescriptor& k : Burst(d, 0, {"#9", "#8"})) c.Add(std::move(k), t0);
  std::vector<Response> rs = c.TakeReady(1 << 20);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].error_message,
            "unnamed allreduce #8: rank 0 submitted it twice before it completed");
  auto report = c.CheckStalls(t0 + 5 * kSecond, 5, 0);
  ASSERT_EQ(report.warnings.size(), 3u);
  EXPECT_EQ(report.warnings[1].rfind("unnamed allreduce #8 has waited 5 s for rank 1 (", 0), 0u)
      << report.warnings[1];
  report = c.CheckStalls(t0 + 6 * kSecond, 100, 6);
  ASSERT_EQ(report.errors.size(), 3u);
  EXPECT_EQ(report.errors[1].keys, Keys{"#8"});
  EXPECT_EQ(report.errors[1].error_message.rfind("unnamed allreduce #8 timed out after 6 s", 0), 0u)
      << report.errors[1].error_message;
}

// Runs: a rank's burst of like unnamed ops, numbered in a row, arrives as one
// KeyedDescriptor with a count, and is matched as one entry, split where other ranks'
// runs start or end.
KeyedDescriptor RunOf(const Descriptor& d, int rank, int64_t first, int64_t count) {
  Descriptor shared = WithRank(d, rank);
  shared.key = UnnamedKey(first, KeyScope(d.group));
  auto desc = std::make_shared<const Descriptor>(std::move(shared));
  return {desc->key, desc, count};
}

Keys Numbered(int64_t first, int64_t count) {
  Keys keys;
  for (int64_t i = 0; i < count; ++i) keys.push_back(UnnamedKey(first + i, ""));
  return keys;
}

// Each response in one line, so that two coordinators' answers compare whole.
std::vector<std::string> Lines(const std::vector<Response>& rs) {
  std::vector<std::string> lines;
  for (const Response& r : rs) {
    std::string dims;
    for (const auto& d : r.first_dims) absl::StrAppend(&dims, "[", absl::StrJoin(d, ","), "]");
    lines.push_back(absl::StrCat(OpName(r.op), " {", absl::StrJoin(r.keys, " "), "} code ",
                                 r.error_code, " '", r.error_message, "' ranks ",
                                 absl::StrJoin(r.ranks, ","), " dims ", dims, " oop ",
                                 r.out_of_place));
  }
  return lines;
}

Descriptor Unnamed(Descriptor d) {
  d.key.clear();
  d.display.clear();  // messages name the op from its key
  return d;
}

TEST(CoordinatorTest, RunsOfEveryRankMakeOneFusedAnswer) {
  Coordinator c(2);
  const Descriptor d = Unnamed(Allreduce(""));
  c.Add(RunOf(d, 1, 0, 64), 0);
  EXPECT_EQ(c.pending(), 64u);
  EXPECT_TRUE(c.TakeReady(1 << 20).empty());
  c.Add(RunOf(d, 0, 0, 64), 0);
  EXPECT_EQ(c.pending(), 0u);
  std::vector<Response> rs = c.TakeReady(1 << 20);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].keys, Numbered(0, 64));
  EXPECT_EQ(rs[0].error_code, 0) << rs[0].error_message;
  EXPECT_TRUE(rs[0].out_of_place);
  // The fusion threshold cuts a run as it cuts single ops: 4 ops of 16 bytes at most.
  c.Add(RunOf(d, 0, 64, 10), 0);
  c.Add(RunOf(d, 1, 64, 10), 0);
  rs = c.TakeReady(64);
  ASSERT_EQ(rs.size(), 3u);
  EXPECT_EQ(rs[0].keys, Numbered(64, 4));
  EXPECT_EQ(rs[1].keys, Numbered(68, 4));
  EXPECT_EQ(rs[2].keys, Numbered(72, 2));
  // Ops that do not fuse: an answer each, from one entry.
  const Descriptor gather = Unnamed(Make(OpType::kAllgather, "", {2, 3}));
  c.Add(RunOf(gather, 0, 74, 3), 0);
  c.Add(RunOf(gather, 1, 74, 3), 0);
  rs = c.TakeReady(1 << 20);
  ASSERT_EQ(rs.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(rs[i].keys, Numbered(74 + i, 1));
    EXPECT_EQ(rs[i].first_dims, (std::vector<std::vector<int64_t>>{{2, 2}}));
  }
  // In a process set: its own numbers.
  Descriptor in_set = d;
  in_set.group = {0, 1};
  c.Add(RunOf(in_set, 0, 0, 2), 0);
  c.Add(RunOf(in_set, 1, 0, 2), 0);
  rs = c.TakeReady(1 << 20);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].keys, (Keys{"#0@0,1", "#1@0,1"}));
  EXPECT_EQ(rs[0].ranks, (std::vector<int32_t>{0, 1}));
}

TEST(CoordinatorTest, RunsSplitWhereOtherRanksRunsStartAndEnd) {
  Coordinator c(3);
  const Descriptor d = Unnamed(Allreduce(""));
  c.Add(RunOf(d, 0, 0, 10), 0);
  c.Add(RunOf(d, 1, 0, 4), 0);
  c.Add(RunOf(d, 2, 2, 3), 0);  // ahead of its #0 and #1: ops #2 and #3 are ready
  EXPECT_EQ(c.pending(), 8u);
  EXPECT_EQ(KeysOf(c.TakeReady(1 << 20)), (std::vector<Keys>{Numbered(2, 2)}));
  c.Add(RunOf(d, 2, 0, 2), 0);
  c.Add(RunOf(d, 1, 4, 1), 0);
  EXPECT_EQ(KeysOf(c.TakeReady(1 << 20)), (std::vector<Keys>{{"#0", "#1", "#4"}}));
  c.Add(RunOf(d, 2, 5, 5), 0);
  EXPECT_EQ(c.pending(), 5u);
  c.Add(RunOf(d, 1, 5, 3), 0);
  c.Add(RunOf(d, 1, 8, 4), 0);  // beyond rank 0's run: #10 and #11 wait for ranks 0 and 2
  EXPECT_EQ(KeysOf(c.TakeReady(1 << 20)), (std::vector<Keys>{Numbered(5, 5)}));
  EXPECT_EQ(c.pending(), 2u);
  c.Add(RunOf(d, 0, 10, 1), 0);
  c.Add(RunOf(d, 2, 10, 2), 0);
  c.Add(RunOf(d, 0, 11, 1), 0);
  EXPECT_EQ(KeysOf(c.TakeReady(1 << 20)), (std::vector<Keys>{Numbered(10, 2)}));
  EXPECT_EQ(c.pending(), 0u);
}

TEST(CoordinatorTest, AnOpOfARunFailsAlone) {
  Coordinator c(2);
  const Descriptor d = Unnamed(Allreduce(""));
  Descriptor wider = d;
  wider.shape = {5};
  c.Add(RunOf(d, 0, 0, 9), 0);
  c.Add(RunOf(d, 1, 0, 2), 0);
  c.Add(RunOf(wider, 1, 2, 1), 0);  // differs on rank 1
  Descriptor refused = d;
  refused.refused_code = kInvalidArgumentCode;
  refused.refused_message = "bad weights";
  c.Add(RunOf(refused, 1, 3, 1), 0);  // refused by rank 1
  c.Add(RunOf(d, 0, 7, 3), 0);        // #7 and #8 a second time
  c.Add(RunOf(d, 1, 4, 5), 0);
  std::vector<Response> rs = c.TakeReady(1 << 20);
  ASSERT_EQ(rs.size(), 6u) << absl::StrJoin(Lines(rs), "\n");
  // Errors decided on arrival first, then the ready ops in order.
  EXPECT_EQ(rs[0].keys, Keys{"#3"});
  EXPECT_EQ(rs[0].error_message,
            "unnamed allreduce #3 failed on rank 1, which refused it: bad weights");
  EXPECT_EQ(rs[0].ranks, (std::vector<int32_t>{0}));
  for (int i : {1, 2}) {
    const std::string key = absl::StrCat("#", 6 + i);
    EXPECT_EQ(rs[i].keys, Keys{key});
    EXPECT_EQ(rs[i].error_message, absl::StrCat("unnamed allreduce ", key,
                                                ": rank 0 submitted it twice before it completed"));
    EXPECT_EQ(rs[i].ranks, (std::vector<int32_t>{0}));
  }
  EXPECT_EQ(rs[3].keys, Numbered(0, 2));
  EXPECT_EQ(rs[3].error_code, 0);
  EXPECT_EQ(rs[4].keys, Keys{"#2"});
  EXPECT_EQ(rs[4].error_message,
            "unnamed allreduce #2: shape differs across ranks: [4] on rank 0; [5] on rank 1");
  EXPECT_EQ(rs[5].keys, Numbered(4, 5));
  EXPECT_EQ(rs[5].error_code, 0);
  EXPECT_EQ(c.pending(), 1u);  // rank 0's #9
}

// Warnings and timeouts name each op of a run that waits, and a late rank's run fails op
// by op.
TEST(CoordinatorTest, EachOpOfAStalledRunIsWarnedAboutAndFails) {
  Coordinator c(2);
  const Descriptor d = Unnamed(Allreduce(""));
  const int64_t t0 = 10 * kSecond;
  c.Add(RunOf(d, 0, 0, 3), t0);
  auto report = c.CheckStalls(t0 + 5 * kSecond, 5, 0);
  ASSERT_EQ(report.warnings.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(report.warnings[i].rfind(
                  absl::StrCat("unnamed allreduce #", i, " has waited 5 s for rank 1 ("), 0),
              0u)
        << report.warnings[i];
  }
  EXPECT_EQ(c.pending(), 3u);
  report = c.CheckStalls(t0 + 6 * kSecond, 100, 6);
  ASSERT_EQ(report.errors.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(report.errors[i].keys, Numbered(i, 1));
    EXPECT_EQ(report.errors[i].error_code, kDeadlineExceededCode);
  }
  EXPECT_EQ(c.pending(), 0u);
  c.Add(RunOf(d, 1, 0, 5), t0 + 7 * kSecond);
  std::vector<Response> rs = c.TakeReady(1 << 20);
  ASSERT_EQ(rs.size(), 5u) << absl::StrJoin(Lines(rs), "\n");
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(rs[i].keys, Numbered(i, 1));
    EXPECT_EQ(rs[i].ranks, (std::vector<int32_t>{1}));
    EXPECT_EQ(rs[i].error_code, i < 3 ? kDeadlineExceededCode
                                      : static_cast<int32_t>(absl::StatusCode::kFailedPrecondition))
        << rs[i].error_message;
  }
  EXPECT_EQ(c.pending(), 0u);
}

// Random bursts, cut into batches differently on every rank, some ops differing on one
// rank or refused by one: the answers for runs are the answers for their ops one by one.
TEST(CoordinatorTest, RunsAnswerAsTheirOpsOneByOne) {
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    SCOPED_TRACE(round);
    const int size = 2 + round % 3;
    const int ops = 30;
    const Descriptor base = Unnamed(Allreduce(""));
    Descriptor gather = Unnamed(Make(OpType::kAllgather, "", {2}));
    // Each rank's ops, in its call order.
    std::vector<std::vector<Descriptor>> calls(size);
    std::vector<Descriptor> kinds(ops, base);
    for (int k = 0; k < ops; ++k) {
      if (rng() % 7 == 0) kinds[k] = gather;
      if (rng() % 11 == 0) kinds[k].shape = {8};  // a new run begins
    }
    for (int r = 0; r < size; ++r) {
      // The last rank stops early in some rounds: its missing ops stall.
      const int mine = r == size - 1 && round % 4 == 0 ? ops - 3 : ops;
      for (int k = 0; k < mine; ++k) {
        Descriptor d = WithRank(kinds[k], r);
        d.key = UnnamedKey(k, "");
        if (rng() % 40 == 0) d.shape = {9};  // differs here
        if (rng() % 60 == 0) {
          d.refused_code = kInvalidArgumentCode;
          d.refused_message = "refused";
        }
        calls[r].push_back(d);
      }
    }
    // Each rank's batches, handed over in a random interleaving.
    std::vector<std::vector<std::vector<const Descriptor*>>> batches(size);
    for (int r = 0; r < size; ++r) {
      for (size_t k = 0; k < calls[r].size();) {
        const size_t n = std::min<size_t>(1 + rng() % 12, calls[r].size() - k);
        std::vector<const Descriptor*> batch;
        for (size_t i = 0; i < n; ++i) batch.push_back(&calls[r][k + i]);
        batches[r].push_back(batch);
        k += n;
      }
    }
    Coordinator runs(size), singles(size);
    std::vector<size_t> next(size, 0);
    std::vector<std::string> got, want;
    for (;;) {
      std::vector<int> left;
      for (int r = 0; r < size; ++r) {
        if (next[r] < batches[r].size()) left.push_back(r);
      }
      if (left.empty()) break;
      const int r = left[rng() % left.size()];
      const auto& batch = batches[r][next[r]++];
      for (KeyedDescriptor& kd : ShareRepeats(batch)) runs.Add(std::move(kd), 0);
      for (const Descriptor* d : batch) singles.Add(*d, 0);
      if (rng() % 2 == 0) {
        const int64_t threshold = rng() % 3 == 0 ? 40 : 1 << 20;
        for (std::string& line : Lines(runs.TakeReady(threshold))) got.push_back(line);
        for (std::string& line : Lines(singles.TakeReady(threshold))) want.push_back(line);
      }
      ASSERT_EQ(runs.pending(), singles.pending());
    }
    for (std::string& line : Lines(runs.TakeReady(1 << 20))) got.push_back(line);
    for (std::string& line : Lines(singles.TakeReady(1 << 20))) want.push_back(line);
    auto a = runs.CheckStalls(5 * kSecond, 5, 0);
    auto b = singles.CheckStalls(5 * kSecond, 5, 0);
    EXPECT_EQ(a.warnings, b.warnings);
    a = runs.CheckStalls(10 * kSecond, 100, 8);
    b = singles.CheckStalls(10 * kSecond, 100, 8);
    EXPECT_EQ(Lines(a.errors), Lines(b.errors));
    EXPECT_EQ(got, want);
    EXPECT_EQ(runs.pending(), 0u);
    EXPECT_EQ(singles.pending(), 0u);
  }
}

// Rank 0's ops differ from each other while rank 1 shares one descriptor: the second op
// is checked again (its descriptors are not those that passed), and fails alone.
TEST(CoordinatorTest, AnOpIsCheckedAgainWhenAnyRanksDescriptorChanged) {
  Coordinator c(2);
  Descriptor d = Allreduce("");
  d.display.clear();
  Descriptor wider = d;
  wider.shape = {5};
  for (KeyedDescriptor& k : Burst(d, 0, {"#0"})) c.Add(std::move(k), 0);
  for (KeyedDescriptor& k : Burst(wider, 0, {"#1"})) c.Add(std::move(k), 0);
  for (KeyedDescriptor& k : Burst(d, 1, {"#0", "#1"})) c.Add(std::move(k), 0);
  std::vector<Response> rs = c.TakeReady(1 << 20);
  ASSERT_EQ(rs.size(), 2u);
  EXPECT_EQ(rs[0].keys, Keys{"#0"});
  EXPECT_EQ(rs[0].error_code, 0) << rs[0].error_message;
  EXPECT_EQ(rs[1].keys, Keys{"#1"});
  EXPECT_EQ(rs[1].error_message,
            "unnamed allreduce #1: shape differs across ranks: [5] on rank 0; [4] on rank 1");
}

// Every message about an op whose descriptor a burst shares names that op, not the burst's
// first: different operations, a refusal, and the end of call-order matching.
TEST(CoordinatorTest, EveryMessageAboutASharedDescriptorNamesItsOwnOp) {
  Coordinator c(2);
  Descriptor d = Allreduce("");
  d.display.clear();
  Descriptor bcast = Make(OpType::kBroadcast, "");
  bcast.display.clear();
  for (KeyedDescriptor& k : Burst(d, 0, {"#0", "#1"})) c.Add(std::move(k), 0);
  for (KeyedDescriptor& k : Burst(bcast, 1, {"#0", "#1"})) c.Add(std::move(k), 0);
  std::vector<Response> rs = c.TakeReady(1 << 20);
  ASSERT_EQ(rs.size(), 2u);
  EXPECT_EQ(rs[1].error_message,
            "unnamed op #1: ranks submitted different operations: allreduce on rank 0; "
            "broadcast on rank 1");

  // Rank 1 refuses a burst rank 0 submitted.
  Descriptor refused = d;
  refused.refused_code = static_cast<int32_t>(absl::StatusCode::kUnimplemented);
  refused.refused_message = "not supported";
  for (KeyedDescriptor& k : Burst(d, 0, {"#2", "#3"})) c.Add(std::move(k), 0);
  for (KeyedDescriptor& k : Burst(refused, 1, {"#2", "#3"})) c.Add(std::move(k), 0);
  rs = c.TakeReady(1 << 20);
  ASSERT_EQ(rs.size(), 2u);
  EXPECT_EQ(rs[1].keys, Keys{"#3"});
  EXPECT_EQ(rs[1].error_message,
            "unnamed allreduce #3 failed on rank 1, which refused it: not supported");

  // #5 (the second op of a burst whose first completed) times out waiting for rank 1: the
  // next burst's #6 and #7 can no longer be matched, and neither can later ones.
  for (KeyedDescriptor& k : Burst(d, 0, {"#4", "#5"})) c.Add(std::move(k), 0);
  for (KeyedDescriptor& k : Burst(d, 1, {"#4"})) c.Add(std::move(k), 0);
  ExpectOkSingle(c.TakeReady(1 << 20), "#4");
  for (KeyedDescriptor& k : Burst(d, 0, {"#6", "#7"})) c.Add(std::move(k), 5 * kSecond);
  auto report = c.CheckStalls(10 * kSecond, 0, 10);
  ASSERT_EQ(report.errors.size(), 3u);
  EXPECT_EQ(report.errors[0].error_message,
            "unnamed allreduce #5 timed out after 10 s (WEFT_STALL_TIMEOUT_SECONDS) waiting for "
            "rank 1");
  EXPECT_EQ(report.errors[2].keys, Keys{"#7"});
  EXPECT_EQ(report.errors[2].error_message.rfind(
                "unnamed allreduce #7: unnamed ops can no longer be matched across ranks, since "
                "unnamed allreduce #5 timed out waiting for rank 1:",
                0),
            0u)
      << report.errors[2].error_message;
  for (KeyedDescriptor& k : Burst(d, 0, {"#8", "#9"})) c.Add(std::move(k), 11 * kSecond);
  rs = c.TakeReady(1 << 20);
  ASSERT_EQ(rs.size(), 2u);
  EXPECT_EQ(rs[1].keys, Keys{"#9"});
  EXPECT_EQ(rs[1].error_message.rfind("unnamed allreduce #9: unnamed ops can no longer", 0), 0u)
      << rs[1].error_message;
}

// ---------------------------------------------------------------------------------------
// Stalls

TEST(CoordinatorTest, StallWarningNamesMissingAndPresentRanks) {
  Coordinator c(3);
  const int64_t t0 = 1000 * kSecond;
  c.Add(WithRank(Allreduce("a"), 0), t0);
  c.Add(WithRank(Allreduce("a"), 1), t0 + 2 * kSecond);  // first_seen stays t0

  auto report = c.CheckStalls(t0 + 5 * kSecond - 1, 5, 0);
  EXPECT_TRUE(report.warnings.empty());
  EXPECT_TRUE(report.errors.empty());

  report = c.CheckStalls(t0 + 5 * kSecond, 5, 0);
  ASSERT_EQ(report.warnings.size(), 1u);
  EXPECT_EQ(report.warnings[0],
            "allreduce 'a' has waited 5 s for rank 2 (submitted by ranks 0-1): a rank that "
            "never calls it stalls every rank; check that all ranks run the same ops in the "
            "same order");
  EXPECT_TRUE(report.errors.empty());

  // Not again until another warning period has passed.
  EXPECT_TRUE(c.CheckStalls(t0 + 6 * kSecond, 5, 0).warnings.empty());
  EXPECT_TRUE(c.CheckStalls(t0 + 10 * kSecond - 1, 5, 0).warnings.empty());
  report = c.CheckStalls(t0 + 10 * kSecond, 5, 0);
  ASSERT_EQ(report.warnings.size(), 1u);
  EXPECT_EQ(report.warnings[0].rfind("allreduce 'a' has waited 10 s for rank 2 (", 0), 0u)
      << report.warnings[0];
  EXPECT_EQ(c.pending(), 1u);
  EXPECT_TRUE(c.TakeReady(1 << 20).empty());

  // The missing rank arrives: ready as usual, no more warnings.
  c.Add(WithRank(Allreduce("a"), 2), t0 + 11 * kSecond);
  ExpectOkSingle(c.TakeReady(1 << 20), "a");
  EXPECT_TRUE(c.CheckStalls(t0 + 100 * kSecond, 5, 0).warnings.empty());
}

TEST(CoordinatorTest, StallWarningPlurals) {
  Coordinator c(4);
  const int64_t t0 = 50 * kSecond;
  c.Add(WithRank(Allreduce("a"), 2), t0);
  c.Add(WithRank(Allreduce("b"), 0), t0 + 3 * kSecond);  // younger: no warning yet
  auto report = c.CheckStalls(t0 + 7 * kSecond, 5, 60);
  ASSERT_EQ(report.warnings.size(), 1u);
  EXPECT_EQ(report.warnings[0].rfind("allreduce 'a' has waited 7 s for ranks 0-1, 3 "
                                     "(submitted by rank 2): ",
                                     0),
            0u)
      << report.warnings[0];
  EXPECT_TRUE(report.errors.empty());
  report = c.CheckStalls(t0 + 8 * kSecond, 5, 60);
  ASSERT_EQ(report.warnings.size(), 1u);
  EXPECT_EQ(report.warnings[0].rfind("allreduce 'b' has waited 5 s for ranks 1-3 "
                                     "(submitted by rank 0): ",
                                     0),
            0u)
      << report.warnings[0];
}

TEST(CoordinatorTest, NoWarningsWhenWarningDisabled) {
  Coordinator c(2);
  c.Add(WithRank(Allreduce("a"), 0), 0);
  auto report = c.CheckStalls(1000 * kSecond, 0, 0);
  EXPECT_TRUE(report.warnings.empty());
  EXPECT_TRUE(report.errors.empty());
  EXPECT_EQ(c.pending(), 1u);
}

TEST(CoordinatorTest, ARefusalFailsTheRanksAlreadyThereAndThoseStillToCome) {
  Coordinator c(4);
  c.Add(WithRank(Allreduce("#3"), 0), 0);
  c.Add(WithRank(Allreduce("#3"), 2), 0);
  Descriptor refused = WithRank(Allreduce("#3"), 1);
  refused.display = "unnamed allreduce #3";
  refused.refused_code = static_cast<int32_t>(absl::StatusCode::kUnimplemented);
  refused.refused_message = "allreduce: complex64 is not supported";
  c.Add(refused, 0);
  EXPECT_EQ(c.pending(), 0u);
  std::vector<Response> rs = c.TakeReady(1 << 20);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].keys, Keys{"#3"});
  EXPECT_EQ(rs[0].status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(rs[0].error_message,
            "unnamed allreduce #3 failed on rank 1, which refused it: allreduce: complex64 is "
            "not supported");
  EXPECT_EQ(rs[0].ranks, (std::vector<int32_t>{0, 2}));
  // Rank 3 submits it later: the same error, at once, to rank 3 alone; nothing waits.
  c.Add(WithRank(Allreduce("#3"), 3), 0);
  rs = c.TakeReady(1 << 20);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].ranks, std::vector<int32_t>{3});
  EXPECT_EQ(rs[0].status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(c.pending(), 0u);
  // The next unnamed op pairs normally.
  AddAll(&c, Allreduce("#4"), 4);
  ExpectOkSingle(c.TakeReady(1 << 20), "#4");
}

TEST(CoordinatorTest, EveryRankRefusingAloneSendsNothing) {
  Coordinator c(3);
  for (int r = 0; r < 3; ++r) {
    Descriptor d = WithRank(Make(OpType::kBroadcast, "#0"), r);
    d.refused_code = static_cast<int32_t>(absl::StatusCode::kInvalidArgument);
    d.refused_message = "broadcast: root_rank 7 is out of range";
    c.Add(d, 0);
  }
  EXPECT_TRUE(c.TakeReady(1 << 20).empty());
  EXPECT_EQ(c.pending(), 0u);
  AddAll(&c, Make(OpType::kBroadcast, "#1"), 3);
  ExpectOkSingle(c.TakeReady(1 << 20), "#1");
}

TEST(CoordinatorTest, ARankThatRefusedANameCanUseItAgain) {
  Coordinator c(2);
  Descriptor refused = WithRank(Allreduce("g"), 1);
  refused.refused_code = static_cast<int32_t>(absl::StatusCode::kInvalidArgument);
  refused.refused_message = "bad";
  c.Add(refused, 0);
  EXPECT_TRUE(c.TakeReady(1 << 20).empty());  // rank 0 has not submitted 'g' yet
  // Rank 1 retries 'g' correctly before rank 0 arrives: a new round, not the old error.
  c.Add(WithRank(Allreduce("g"), 1), 0);
  EXPECT_TRUE(c.TakeReady(1 << 20).empty());
  // Rank 0's first 'g' pairs with the refused one and fails...
  c.Add(WithRank(Allreduce("g"), 0), 0);
  std::vector<Response> rs = c.TakeReady(1 << 20);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].ranks, std::vector<int32_t>{0});
  EXPECT_EQ(rs[0].status().code(), absl::StatusCode::kInvalidArgument);
  // ...and its second pairs with rank 1's retry.
  c.Add(WithRank(Allreduce("g"), 0), 0);
  ExpectOkSingle(c.TakeReady(1 << 20), "g");
}

TEST(CoordinatorTest, ARefusalInAProcessSetOwesOnlyItsMembers) {
  Coordinator c(4);
  Descriptor refused = WithRank(Allreduce("#0@1,3"), 3);
  refused.group = {1, 3};
  refused.refused_code = static_cast<int32_t>(absl::StatusCode::kInvalidArgument);
  refused.refused_message = "bad";
  c.Add(refused, 0);
  Descriptor d = WithRank(Allreduce("#0@1,3"), 1);
  d.group = {1, 3};
  c.Add(d, 0);
  std::vector<Response> rs = c.TakeReady(1 << 20);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].ranks, std::vector<int32_t>{1});
  EXPECT_EQ(c.pending(), 0u);
}

TEST(CoordinatorTest, StallsAreReportedInKeyOrder) {
  // The pending keys live in a hash map; reports still list them in key order.
  Coordinator c(2);
  const std::vector<std::string> names = {"m", "c", "x", "a", "q", "k", "b", "z", "e", "t"};
  for (const std::string& n : names) c.Add(WithRank(Allreduce(n), 0), 0);
  c.Add(WithRank(Allreduce("late"), 0), 9 * kSecond);  // waited 1 s: warned about
  c.Add(WithRank(Allreduce("later"), 0), 9 * kSecond);
  auto report = c.CheckStalls(10 * kSecond, 1, 5);
  std::vector<std::string> sorted = names;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::string> failed;
  for (const Response& e : report.errors) failed.push_back(e.keys.at(0));
  EXPECT_EQ(failed, sorted);
  ASSERT_EQ(report.warnings.size(), 2u);
  EXPECT_EQ(report.warnings[0].rfind("allreduce 'late' has waited", 0), 0u) << report.warnings[0];
  EXPECT_EQ(report.warnings[1].rfind("allreduce 'later' has waited", 0), 0u) << report.warnings[1];
}

TEST(CoordinatorTest, StallTimeoutFailsTheKey) {
  Coordinator c(4);
  const int64_t t0 = 7 * kSecond;
  c.Add(WithRank(Allreduce("a"), 0), t0);
  c.Add(WithRank(Allreduce("a"), 2), t0 + kSecond);
  c.Add(WithRank(Allreduce("other"), 1), t0 + 20 * kSecond);

  auto report = c.CheckStalls(t0 + 30 * kSecond - 1, 100, 30);
  EXPECT_TRUE(report.errors.empty());
  EXPECT_TRUE(report.warnings.empty());

  report = c.CheckStalls(t0 + 30 * kSecond, 5, 30);
  ASSERT_EQ(report.errors.size(), 1u);
  const Response& e = report.errors[0];
  EXPECT_EQ(e.keys, Keys{"a"});
  EXPECT_EQ(e.op, OpType::kAllreduce);
  EXPECT_EQ(e.error_code, kDeadlineExceededCode);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(e.error_message,
            "allreduce 'a' timed out after 30 s (WEFT_STALL_TIMEOUT_SECONDS) waiting for ranks "
            "1, 3");
  EXPECT_EQ(e.ranks, (std::vector<int32_t>{0, 2}));
  // "other" has waited 10 s: a warning, not an error; "a" is not warned about as well.
  ASSERT_EQ(report.warnings.size(), 1u);
  EXPECT_EQ(report.warnings[0].rfind("allreduce 'other' has waited 10 s for ranks 0, 2-3 ",
                                     0),
            0u)
      << report.warnings[0];
  EXPECT_EQ(c.pending(), 1u);  // only "other"
  EXPECT_TRUE(c.TakeReady(1 << 20).empty());
  EXPECT_TRUE(c.CheckStalls(t0 + 31 * kSecond, 5, 30).errors.empty());

  // A rank that comes late gets the same error at once, addressed to it alone.
  c.Add(WithRank(Allreduce("a"), 3), t0 + 40 * kSecond);
  EXPECT_EQ(c.pending(), 1u);
  std::vector<Response> rs = c.TakeReady(1 << 20);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].keys, Keys{"a"});
  EXPECT_EQ(rs[0].error_code, kDeadlineExceededCode);
  EXPECT_EQ(rs[0].error_message, e.error_message);
  EXPECT_EQ(rs[0].ranks, std::vector<int32_t>{3});

  c.Add(WithRank(Allreduce("a"), 1), t0 + 41 * kSecond);
  rs = c.TakeReady(1 << 20);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].error_code, kDeadlineExceededCode);
  EXPECT_EQ(rs[0].error_message, e.error_message);
  EXPECT_EQ(rs[0].ranks, std::vector<int32_t>{1});

  // Every owed rank came: the key starts a new round.
  c.Add(WithRank(Allreduce("a"), 1), t0 + 50 * kSecond);
  EXPECT_TRUE(c.TakeReady(1 << 20).empty());
  EXPECT_EQ(c.pending(), 2u);
  for (int r : {0, 2, 3}) c.Add(WithRank(Allreduce("a"), r), t0 + 51 * kSecond);
  ExpectOkSingle(c.TakeReady(1 << 20), "a");
  EXPECT_EQ(c.pending(), 1u);
  // Only "other" (waiting since t0 + 20 s) times out now.
  report = c.CheckStalls(t0 + 50 * kSecond, 100, 30);
  ASSERT_EQ(report.errors.size(), 1u);
  EXPECT_EQ(report.errors[0].keys, Keys{"other"});
  EXPECT_EQ(report.errors[0].ranks, std::vector<int32_t>{1});
  EXPECT_EQ(c.pending(), 0u);
}

// Rank 2 skips unnamed op #5: its next unnamed op is numbered #5 as well, so from there on
// the same number names different ops on different ranks. After the timeout every unnamed
// op of that scope fails (the ones in flight, and each later one at once); named ops and
// other process sets' unnamed ops go on working.
TEST(CoordinatorTest, AnUnnamedTimeoutEndsCallOrderMatchingInItsScope) {
  Coordinator c(3);
  Descriptor in_set = Allreduce("#0@0,1");
  in_set.group = {0, 1};
  for (int r : {0, 1}) c.Add(WithRank(Allreduce("#5"), r), 0);
  for (int r : {0, 1}) c.Add(WithRank(Allreduce("#6"), r), kSecond);
  for (int r : {0, 1}) c.Add(WithRank(Allreduce("a"), r), kSecond);
  c.Add(WithRank(in_set, 0), kSecond);

  auto report = c.CheckStalls(10 * kSecond, 0, 10);
  ASSERT_EQ(report.errors.size(), 2u);
  EXPECT_EQ(report.errors[0].keys, Keys{"#5"});
  EXPECT_EQ(report.errors[0].error_code, kDeadlineExceededCode);
  EXPECT_EQ(report.errors[1].keys, Keys{"#6"});
  EXPECT_EQ(report.errors[1].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(report.errors[1].ranks, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(report.errors[1].error_message,
            "allreduce '#6': unnamed ops can no longer be matched across ranks, since "
            "allreduce '#5' timed out waiting for rank 2: a rank that skipped it counts its "
            "unnamed calls one behind the others, and matching by number would combine "
            "different ops. Named ops still work; to use unnamed ones again, shut down and "
            "re-initialize weft");
  EXPECT_EQ(c.pending(), 2u);  // "a" and the process set's "#0"

  // Rank 2's next unnamed op takes the timed-out number and gets its error; every later
  // one fails at once, on whichever rank submits it, without waiting for the others.
  c.Add(WithRank(Allreduce("#5"), 2), 11 * kSecond);
  c.Add(WithRank(Allreduce("#6"), 2), 11 * kSecond);
  c.Add(WithRank(Allreduce("#7"), 0), 11 * kSecond);
  std::vector<Response> rs = c.TakeReady(0);
  ASSERT_EQ(rs.size(), 3u);
  EXPECT_EQ(rs[0].error_code, kDeadlineExceededCode);
  EXPECT_EQ(rs[0].ranks, std::vector<int32_t>{2});
  EXPECT_EQ(rs[1].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(rs[1].ranks, std::vector<int32_t>{2});
  EXPECT_EQ(rs[2].keys, Keys{"#7"});
  EXPECT_EQ(rs[2].ranks, std::vector<int32_t>{0});
  EXPECT_NE(rs[2].error_message.find("'#5' timed out waiting for rank 2"), std::string::npos)
      << rs[2].error_message;
  EXPECT_EQ(c.pending(), 2u);

  c.Add(WithRank(Allreduce("a"), 2), 12 * kSecond);
  ExpectOkSingle(c.TakeReady(0), "a");
  c.Add(WithRank(in_set, 1), 12 * kSecond);
  rs = c.TakeReady(0);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].error_code, 0) << rs[0].error_message;
  EXPECT_EQ(rs[0].keys, Keys{"#0@0,1"});
  EXPECT_EQ(c.pending(), 0u);
}

TEST(CoordinatorTest, NewRoundOfAFailedKeyHasItsOwnClock) {
  Coordinator c(2);
  c.Add(WithRank(Allreduce("a"), 0), 0);
  auto report = c.CheckStalls(10 * kSecond, 0, 10);
  ASSERT_EQ(report.errors.size(), 1u);
  EXPECT_EQ(report.errors[0].ranks, std::vector<int32_t>{0});
  EXPECT_EQ(report.errors[0].error_message,
            "allreduce 'a' timed out after 10 s (WEFT_STALL_TIMEOUT_SECONDS) waiting for rank 1");
  c.Add(WithRank(Allreduce("a"), 1), 11 * kSecond);  // owed: gets the error
  std::vector<Response> rs = c.TakeReady(0);
  ASSERT_EQ(rs.size(), 1u);
  EXPECT_EQ(rs[0].ranks, std::vector<int32_t>{1});
  EXPECT_EQ(rs[0].error_code, kDeadlineExceededCode);

  c.Add(WithRank(Allreduce("a"), 1), 12 * kSecond);  // a new round
  EXPECT_TRUE(c.TakeReady(0).empty());
  EXPECT_EQ(c.pending(), 1u);
  EXPECT_TRUE(c.CheckStalls(21 * kSecond, 0, 10).errors.empty());
  report = c.CheckStalls(22 * kSecond, 0, 10);
  ASSERT_EQ(report.errors.size(), 1u);
  EXPECT_EQ(report.errors[0].ranks, std::vector<int32_t>{1});
  EXPECT_EQ(report.errors[0].error_message,
            "allreduce 'a' timed out after 10 s (WEFT_STALL_TIMEOUT_SECONDS) waiting for rank 0");
}

TEST(CoordinatorTest, FractionalTimeout) {
  Coordinator c(3);
  c.Add(WithRank(Make(OpType::kBarrier, "#1", {}), 1), 0);
  EXPECT_TRUE(c.CheckStalls(2499999, 0, 2.5).errors.empty());
  auto report = c.CheckStalls(2500000, 0, 2.5);
  ASSERT_EQ(report.errors.size(), 1u);
  EXPECT_EQ(report.errors[0].op, OpType::kBarrier);
  EXPECT_EQ(report.errors[0].keys, Keys{"#1"});
  EXPECT_EQ(report.errors[0].error_message,
            "barrier '#1' timed out after 2.5 s (WEFT_STALL_TIMEOUT_SECONDS) waiting for ranks "
            "0, 2");
  EXPECT_EQ(report.errors[0].ranks, std::vector<int32_t>{1});
}

// ---------------------------------------------------------------------------------------
// Formatting

TEST(FormattingTest, RankList) {
  EXPECT_EQ(RankList({}), "");
  EXPECT_EQ(RankList({3}), "3");
  EXPECT_EQ(RankList({0, 1, 2, 5}), "0-2, 5");
  EXPECT_EQ(RankList({5, 2, 0, 1}), "0-2, 5");
  EXPECT_EQ(RankList({1, 2}), "1-2");
  EXPECT_EQ(RankList({0, 2, 4}), "0, 2, 4");
  EXPECT_EQ(RankList({0, 1, 3, 4, 5, 9, 11, 12}), "0-1, 3-5, 9, 11-12");
}

TEST(FormattingTest, DescribeDisagreement) {
  EXPECT_EQ(DescribeDisagreement({}), "");
  EXPECT_EQ(DescribeDisagreement({{0, "x"}}), "");
  EXPECT_EQ(DescribeDisagreement({{0, "x"}, {1, "x"}, {2, "x"}}), "");
  EXPECT_EQ(DescribeDisagreement({{0, "[4]"}, {1, "[4]"}, {2, "[5]"}, {3, "[4]"}}),
            "[4] on ranks 0-1, 3; [5] on rank 2");
  // Groups in the order of their first rank.
  EXPECT_EQ(DescribeDisagreement({{0, "b"}, {1, "a"}, {2, "c"}, {3, "a"}}),
            "b on rank 0; a on ranks 1, 3; c on rank 2");
  EXPECT_EQ(DescribeDisagreement({{4, "x"}, {5, "y"}}), "x on rank 4; y on rank 5");
}

}  // namespace
}  // namespace comm
}  // namespace weft
