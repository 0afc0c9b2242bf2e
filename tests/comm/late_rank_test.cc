// A rank that comes late to one op must not leave the ops after it slow. Ranks that wait
// longer than their polling window (WEFT_ENGINE_SPIN_MICROS) leave the polling to the
// engine thread, which sleeps between polls; when it saw the late rank's message up to a
// millisecond late, the late rank in turn waited past its own window for the answer, and
// so on: ops that do not make the ranks wait for each other (a broadcast's root returns
// once its message has left) went on taking milliseconds instead of microseconds, for
// hundreds of ops (comm/spin.h, BusySleepMicros).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <sstream>
#include <vector>

#include "comm/comm.h"
#include "gtest/gtest.h"
#include "tests/comm/test_util.h"

namespace weft {
namespace {

const auto* const kEnv = testing::InitWeftForAllTests();

double MicrosSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
      .count();
}

// Rounds of 50 ops, one of `players` (ranks 0..players-1, in turn) 5 ms late to each
// round's first; `op` runs one op on this rank (the others only take part in the rounds'
// barriers). A 4-byte op takes microseconds here and 3-4 ms in the slow state; a round is
// slow when the median of its ops after the first five is over a millisecond (beside
// other busy programs: 0.3-0.5 ms). One slow round is left to chance (another program
// taking the cores for a while).
void ExpectNoSlowRounds(const char* what, int players, const std::function<Status()>& op) {
  constexpr int kRounds = 6;
  constexpr int kOps = 50;
  constexpr int kSettle = 5;
  constexpr double kLateMicros = 5000;
  constexpr double kSlowMicros = 1000;
  const bool playing = rank() < players;
  std::vector<double> medians;
  for (int round = 0; round < kRounds; ++round) {
    ASSERT_TRUE(barrier().ok());
    if (!playing) continue;
    if (rank() == round % players) {
      const auto late = std::chrono::steady_clock::now();
      while (MicrosSince(late) < kLateMicros) {
      }
    }
    std::vector<double> took;
    for (int i = 0; i < kOps; ++i) {
      const auto start = std::chrono::steady_clock::now();
      ASSERT_TRUE(op().ok());
      if (i >= kSettle) took.push_back(MicrosSince(start));
    }
    std::nth_element(took.begin(), took.begin() + took.size() / 2, took.end());
    medians.push_back(took[took.size() / 2]);
  }
  if (!playing) return;
  const int slow = static_cast<int>(
      std::count_if(medians.begin(), medians.end(), [&](double m) { return m > kSlowMicros; }));
  std::ostringstream said;
  for (double m : medians) said << " " << m;
  std::printf("rank %d: median us per %s in each round:%s\n", rank(), what, said.str().c_str());
  EXPECT_LE(slow, 1) << "rank " << rank() << ": median us per " << what
                     << " in each round:" << said.str();
}

// A broadcast's root returns once its message has left.
TEST(LateRank, BroadcastsAfterALateOneRunAtFullSpeed) {
  if (size() == 1) GTEST_SKIP() << "needs several ranks";
  testing::Buffer x(DType::kFloat32, {1});
  x.Fill(rank());
  ExpectNoSlowRounds("broadcast", size(), [&] { return broadcast(x.view(), x.view(), 0); });
  EXPECT_EQ(x.Get(0), 0.0);
}

// Between two ranks, and a sender does not wait for its receiver.
TEST(LateRank, SendsAfterALateOneRunAtFullSpeed) {
  if (size() == 1) GTEST_SKIP() << "needs several ranks";
  testing::Buffer x(DType::kFloat32, {1});
  x.Fill(rank());
  ExpectNoSlowRounds("send/recv", 2,
                     [&] { return rank() == 0 ? send(x.view(), 1) : recv(x.view(), 0); });
  if (rank() < 2) {
    EXPECT_EQ(x.Get(0), 0.0);
  }
}

}  // namespace
}  // namespace weft
