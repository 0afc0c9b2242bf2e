#include "comm/ring_allreduce.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "comm/reduce.h"

namespace weft {
namespace comm {
namespace {

Status Ring(PeerTransport& transport, const std::vector<int>& members, int me, const char* in,
            char* data, size_t count, DType dtype, size_t chunk_bytes,
            AlignedVector<char>* scratch) {
  using Ticket = PeerTransport::Ticket;
  const int n = static_cast<int>(members.size());
  const size_t item = DTypeSize(dtype);
  const int next = members[(me + 1) % n], prev = members[(me + n - 1) % n];
  const int steps = 2 * (n - 1);
  // Out of place, step 0 sends from `in` and the sums read it, and each reduce-scatter step
  // receives straight into the segment of `data` its sum then overwrites: no copy of the
  // input, and no scratch memory.
  const bool in_place = in == data;
  auto seg_begin = [&](int seg) { return count * static_cast<size_t>(seg) / n; };
  // The segment received in step t; the one sent in step t is recv_seg(t - 1), and
  // this rank's own in step 0.
  auto recv_seg = [&](int t) {
    return ((t < n - 1 ? me - t - 1 : me - (t - (n - 1))) + 2 * n) % n;
  };
  size_t largest = 0;
  for (int seg = 0; seg < n; ++seg) {
    largest = std::max(largest, seg_begin(seg + 1) - seg_begin(seg));
  }
  // In place, reduce-scatter steps receive into one of two scratch halves (step parity), so
  // that the next step's receives can be posted while this step's chunks are summed.
  if (in_place && scratch->size() < 2 * largest * item) scratch->resize(2 * largest * item);
  // Where step t < n - 1 receives the segment that begins at element `begin`.
  auto partial = [&](int t, size_t begin) -> char* {
    return in_place ? scratch->data() + (t % 2) * largest * item : data + begin * item;
  };
  const size_t chunk = std::max<size_t>(1, chunk_bytes / item);
  std::vector<std::vector<Ticket>> sends(steps), recvs(steps);
  std::vector<char> recvs_posted(steps, 0);

  auto for_chunks = [&](int seg, auto&& fn) -> Status {
    const size_t begin = seg_begin(seg), end = seg_begin(seg + 1);
    size_t c = 0;
    for (size_t at = begin; at < end; at += chunk, ++c) {
      WEFT_RETURN_IF_ERROR(fn(c, at, std::min(chunk, end - at)));
    }
    return OkStatus();
  };
  auto wait_all = [&](std::vector<Ticket>& tickets) -> Status {
    for (Ticket t : tickets) WEFT_RETURN_IF_ERROR(transport.Wait(t));
    tickets.clear();
    return OkStatus();
  };
  auto send_chunk = [&](int t, size_t at, size_t len) -> Status {
    const char* from = t == 0 ? in : data;
    WEFT_ASSIGN_OR_RETURN(Ticket ticket, transport.Send(next, from + at * item, len * item));
    sends[t].push_back(ticket);
    return OkStatus();
  };
  auto post_recvs = [&](int t) -> Status {
    if (t >= steps || recvs_posted[t]) return OkStatus();
    const int seg = recv_seg(t);
    if (t >= n - 1 && (in_place || t - (n - 1) > 0)) {
      // The allgather receives in place, over the segment this rank sent in step
      // t - (n - 1): that send must be complete first (out of place, step 0 sent `in`).
      WEFT_RETURN_IF_ERROR(wait_all(sends[t - (n - 1)]));
    }
    const size_t begin = seg_begin(seg);
    char* into = t < n - 1 ? partial(t, begin) : data + begin * item;
    WEFT_RETURN_IF_ERROR(for_chunks(seg, [&](size_t, size_t at, size_t len) -> Status {
      WEFT_ASSIGN_OR_RETURN(Ticket ticket,
                            transport.Recv(prev, into + (at - begin) * item, len * item));
      recvs[t].push_back(ticket);
      return OkStatus();
    }));
    recvs_posted[t] = 1;
    return OkStatus();
  };

  WEFT_RETURN_IF_ERROR(post_recvs(0));
  WEFT_RETURN_IF_ERROR(
      for_chunks(me, [&](size_t, size_t at, size_t len) { return send_chunk(0, at, len); }));
  for (int t = 0; t < steps; ++t) {
    // Post the next step's receives ahead, unless (two ranks, in place) they land on the
    // segment this step is still sending; then after this step's sends.
    if (!(in_place && t + 1 >= n - 1 && t + 1 - (n - 1) == t)) {
      WEFT_RETURN_IF_ERROR(post_recvs(t + 1));
    }
    const int seg = recv_seg(t);
    const size_t begin = seg_begin(seg);
    const char* part = t < n - 1 ? partial(t, begin) : nullptr;
    WEFT_RETURN_IF_ERROR(for_chunks(seg, [&](size_t c, size_t at, size_t len) -> Status {
      WEFT_RETURN_IF_ERROR(transport.Wait(recvs[t][c]));
      if (t < n - 1) Add(data + at * item, in + at * item, part + (at - begin) * item, dtype, len);
      return t + 1 < steps ? send_chunk(t + 1, at, len) : OkStatus();
    }));
    recvs[t].clear();
    if (t + 1 < steps && !recvs_posted[t + 1]) {
      WEFT_RETURN_IF_ERROR(wait_all(sends[t]));
      WEFT_RETURN_IF_ERROR(post_recvs(t + 1));
    }
  }
  for (auto& step : sends) WEFT_RETURN_IF_ERROR(wait_all(step));
  return OkStatus();
}

// Ends a ring whose sends have all completed on this rank: each rank tells the next one so,
// and leaves once the rank before it has told it the same. A send may complete only once
// its receiver has acknowledged it, after its own receive completed; over Open MPI's shared
// memory a large message is read by the receiver, which then queues the acknowledgement and
// sends it from a later call into MPI. A rank that left the ring with its receives done but
// acknowledgements still queued (64 or more chunks in flight at once) made no further MPI
// call while its engine idled, and the rank before it waited for its sends for good. Here
// each rank keeps calling into the transport until the rank before it has all its
// acknowledgements.
Status CloseRing(PeerTransport& transport, const std::vector<int>& members, int me) {
  const int n = static_cast<int>(members.size());
  const int next = members[(me + 1) % n], prev = members[(me + n - 1) % n];
  char sent = 1, received = 0;
  WEFT_ASSIGN_OR_RETURN(PeerTransport::Ticket from_prev, transport.Recv(prev, &received, 1));
  WEFT_ASSIGN_OR_RETURN(PeerTransport::Ticket to_next, transport.Send(next, &sent, 1));
  WEFT_RETURN_IF_ERROR(transport.Wait(to_next));
  return transport.Wait(from_prev);
}

}  // namespace

Status RingAllreduceSum(PeerTransport& transport, const std::vector<int>& members, int me,
                        const void* in, void* out, size_t count, DType dtype, size_t chunk_bytes,
                        AlignedVector<char>* scratch) {
  if (count == 0) return OkStatus();
  if (members.size() <= 1) {
    if (in != out) std::memcpy(out, in, count * DTypeSize(dtype));
    return OkStatus();
  }
  Status status = Ring(transport, members, me, static_cast<const char*>(in),
                       static_cast<char*>(out), count, dtype, chunk_bytes, scratch);
  if (status.ok()) status = CloseRing(transport, members, me);
  // Whatever happened, nothing may still refer to in, out or scratch.
  Status rest = transport.WaitAll();
  return status.ok() ? rest : status;
}

}  // namespace comm
}  // namespace weft
