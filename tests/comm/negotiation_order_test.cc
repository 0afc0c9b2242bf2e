// The order of the negotiation's MPI calls around an op's answer. An MPI_Iprobe that finds
// nothing yields the core inside Open MPI where mpi_yield_when_idle is on (mpirun turns it
// on when ranks outnumber cores), so a probe between the moment an op could run and the
// moment it does costs that op a scheduling turn of every rank sharing the core. Two
// such probes are checked for here: on rank 0, between the last descriptor of an op
// (another rank's message, or its own call) and its answer; on the other ranks, between
// the answer that completes their op and the op's return to the caller.
//
// The test wraps MPI_Iprobe, MPI_Recv and MPI_Isend (MPI's profiling interface: the
// engine, linked into this binary, calls these) and records weft's negotiation traffic,
// told apart by its tags, next to the caller's own marks. The BUILD rule sends that traffic
// through MPI on every rank, as for ranks on other machines than rank 0's (the ranks on its
// machine otherwise use shared memory, whose polls never enter MPI).
#include <mpi.h>

#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm.h"
#include "gtest/gtest.h"
#include "tests/comm/test_util.h"

namespace {

// comm/control_channel.cc: a rank's descriptors to rank 0, and rank 0's answers.
constexpr int kDescriptorTag = 1;
constexpr int kResponseTag = 2;

enum class Event : char {
  kCall,        // the caller starts a blocking op
  kReturn,      // ...and it returned
  kEmptyProbe,  // the caller's MPI_Iprobe for negotiation traffic found nothing
  kDescriptorIn,
  kAnswerIn,       // received by the caller
  kAnswerInOther,  // received by another thread (the engine thread)
  kAnswerOut,
  kNone,  // not recorded
};

std::mutex g_mu;
std::vector<Event>* g_events = nullptr;  // g_mu; recording while set
std::thread::id g_caller;                // g_mu; the thread that calls the ops

// Records `by_caller` where the thread that calls the ops makes the call, `elsewhere` where
// another does (the engine thread, which wakes now and then to watch for stalls, and may
// take an answer while the caller polls); nothing for kNone.
void RecordBy(Event by_caller, Event elsewhere) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_events == nullptr) return;
  const Event e = std::this_thread::get_id() == g_caller ? by_caller : elsewhere;
  if (e != Event::kNone) g_events->push_back(e);
}

void Record(Event e) { RecordBy(e, e); }

}  // namespace

extern "C" int MPI_Iprobe(int source, int tag, MPI_Comm comm, int* flag, MPI_Status* status) {
  const int rc = PMPI_Iprobe(source, tag, comm, flag, status);
  // Only the caller's probes count: its turns are the op's.
  if (!*flag && (tag == kDescriptorTag || tag == kResponseTag)) {
    RecordBy(Event::kEmptyProbe, Event::kNone);
  }
  return rc;
}

extern "C" int MPI_Recv(void* buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm,
                        MPI_Status* status) {
  const int rc = PMPI_Recv(buf, count, type, source, tag, comm, status);
  if (tag == kDescriptorTag) Record(Event::kDescriptorIn);
  if (tag == kResponseTag) RecordBy(Event::kAnswerIn, Event::kAnswerInOther);
  return rc;
}

extern "C" int MPI_Isend(const void* buf, int count, MPI_Datatype type, int dest, int tag,
                         MPI_Comm comm, MPI_Request* request) {
  if (tag == kResponseTag) Record(Event::kAnswerOut);
  return PMPI_Isend(buf, count, type, dest, tag, comm, request);
}

namespace weft {
namespace {

constexpr int kOps = 200;

// Records the negotiation's traffic on this rank while `run` runs, every rank recording
// before any sends the first message of it.
std::vector<Event> Recorded(const std::function<void()>& run) {
  testing::Buffer x(DType::kFloat32, {16});
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(allreduce(x.view(), x.view(), false).ok());
  std::vector<Event> events;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g_events = &events;
    g_caller = std::this_thread::get_id();
  }
  MPI_Barrier(MPI_COMM_WORLD);
  run();
  MPI_Barrier(MPI_COMM_WORLD);
  std::lock_guard<std::mutex> lock(g_mu);
  g_events = nullptr;
  return events;
}

// Rank 0: descriptors received since the last answer it sent.
int DescriptorsSinceLastAnswer() {
  std::lock_guard<std::mutex> lock(g_mu);
  int n = 0;
  for (auto it = g_events->rbegin(); it != g_events->rend() && *it != Event::kAnswerOut; ++it) {
    n += *it == Event::kDescriptorIn;
  }
  return n;
}

// A blocking allreduce between the caller's marks, checked.
void MarkedAllreduce(testing::Buffer& x, int op, const std::string& name = "") {
  x.Fill(rank() + op);
  Record(Event::kCall);
  const Status st = allreduce(x.view(), x.view(), false, name);
  Record(Event::kReturn);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(x.Get(15), size() * (size() - 1) / 2.0 + size() * op) << "op " << op;
}

// Other ranks: no empty probe between the answer that completes an op and its return.
// Only answers the caller took count: where the engine thread took one (it woke while the
// caller waited), the caller's next probe finds nothing by no fault of the order.
void CheckCallerReturnsAtOnce(const std::vector<Event>& events, int ops) {
  int answers = 0, returns = 0, late_probes = 0;
  bool answered = false;  // the current op's answer is in
  for (Event e : events) {
    switch (e) {
      case Event::kAnswerIn:
        ++answers;
        answered = true;
        break;
      case Event::kAnswerInOther:
        ++answers;
        break;
      case Event::kReturn:
        ++returns;
        answered = false;
        break;
      case Event::kEmptyProbe:
        if (answered) ++late_probes;
        break;
      default:
        break;
    }
  }
  EXPECT_EQ(answers, ops);
  EXPECT_EQ(returns, ops);
  EXPECT_EQ(late_probes, 0) << "rank " << rank()
                            << " probed for answers, and found none, after the answer that "
                               "completed its op and before the op returned";
}

// Each test runs in a weft of its own; one rank has no negotiation messages.
class NegotiationOrder : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(init().ok());
    if (size() < 2) GTEST_SKIP() << "one rank has no negotiation messages";
  }
  void TearDown() override { EXPECT_TRUE(shutdown().ok()); }
};

TEST_F(NegotiationOrder, AnswerAndReturnFollowTheLastDescriptorWithoutAnEmptyProbe) {
  testing::Buffer x(DType::kFloat32, {16});
  const std::vector<Event> events = Recorded([&] {
    for (int op = 0; op < kOps; ++op) MarkedAllreduce(x, op);
  });
  const int others = size() - 1;
  if (rank() == 0) {
    // Op k (from 1) can run once this rank has called it and the others' k-th descriptors
    // are in; its answer is the first of the next `others` sends.
    int calls = 0, descriptors = 0, answers = 0, answered = 0, late_probes = 0;
    bool ready = false;
    for (Event e : events) {
      switch (e) {
        case Event::kCall:
          ++calls;
          break;
        case Event::kDescriptorIn:
          ++descriptors;
          break;
        case Event::kAnswerOut:
          if (answers++ % others == 0) {
            ++answered;
            ready = false;
          }
          break;
        case Event::kEmptyProbe:
          if (ready) ++late_probes;
          break;
        default:
          break;
      }
      const int next = answered + 1;
      if (!ready && calls >= next && descriptors >= next * others) ready = true;
    }
    EXPECT_EQ(descriptors, kOps * others);
    EXPECT_EQ(answers, kOps * others);
    EXPECT_EQ(late_probes, 0) << "rank 0 probed for descriptors, and found none, between an "
                                 "op being ready and its answer";
  } else {
    CheckCallerReturnsAtOnce(events, kOps);
  }
}

// Rank 0's own call is the last an op waits for: the others' descriptors are in before it
// calls (its engine takes them while it polls a named op of its own, which the others call
// after the unnamed one), and the answer must leave without a probe first.
TEST_F(NegotiationOrder, AnswerFollowsRankZerosOwnLastCallWithoutAnEmptyProbe) {
  constexpr int kLateOps = 50;
  testing::Buffer x(DType::kFloat32, {16}), y(DType::kFloat32, {16});
  const std::vector<Event> events = Recorded([&] {
    for (int op = 0; op < kLateOps; ++op) {
      const std::string after = "after" + std::to_string(op);
      if (rank() == 0) {
        y.Fill(rank() + op);
        auto h = allreduce_nonblocking(y.view(), y.view(), false, after);
        ASSERT_TRUE(h.ok()) << h.status();
        // Until the engine has taken every other rank's descriptor of the unnamed op (at
        // most a few seconds, on a machine busy with other tests).
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (DescriptorsSinceLastAnswer() < size() - 1 &&
               std::chrono::steady_clock::now() < until) {
          EXPECT_FALSE(poll(*h));  // the others call it after the unnamed op
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
        MarkedAllreduce(x, op);
        EXPECT_TRUE(wait(*h).ok());
      } else {
        MarkedAllreduce(x, op);
        MarkedAllreduce(y, op, after);
      }
    }
  });
  const int others = size() - 1;
  if (rank() == 0) {
    // Armed at a call that finds every other rank's descriptor of its op in since the last
    // answer; disarmed by the next answer.
    int since_answer = 0, answers = 0, checked = 0, late_probes = 0;
    bool armed = false;
    for (Event e : events) {
      switch (e) {
        case Event::kDescriptorIn:
          ++since_answer;
          break;
        case Event::kCall:
          armed = since_answer == others;
          checked += armed;
          break;
        case Event::kAnswerOut:
          if (answers++ % others == 0) {
            armed = false;
            since_answer = 0;
          }
          break;
        case Event::kEmptyProbe:
          if (armed) ++late_probes;
          break;
        default:
          break;
      }
    }
    // Its engine took the descriptors while it polled, for every op but on a stalled machine.
    EXPECT_GE(checked, kLateOps / 2);
    EXPECT_EQ(late_probes, 0) << "rank 0 probed for descriptors, and found none, after its own "
                                 "call made an op ready and before the op's answer";
  }
  // The other ranks wait a millisecond for each unnamed op here, long enough to hand their
  // progress to the engine thread, which then takes answers while the caller may still
  // poll: the first test checks them.
}

}  // namespace
}  // namespace weft
