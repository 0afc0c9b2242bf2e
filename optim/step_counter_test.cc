#include "optim/step_counter.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace weft {
namespace {

using Event = StepCounter::Event;

// Runs a pattern of F (a counted computation), S/s (a step() expected to communicate or
// not) and ' ' (ignored) through a one-unit counter. Returns "" or what went wrong; the
// 1-based indexes of the computations that warned go to `misuses`.
std::string RunPattern(StepCounter& c, const std::string& pattern, std::vector<int>* misuses) {
  int f = 0;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char ch = pattern[i];
    if (ch == ' ') continue;
    if (ch == 'F') {
      ++f;
      auto e = c.OnComputation();
      if (!e.ok()) return e.status().ToString();
      if (*e == Event::kMisuse) misuses->push_back(f);
      continue;
    }
    auto s = c.OnStep();
    if (!s.ok()) return s.status().ToString();
    if (*s != (ch == 'S')) {
      return "position " + std::to_string(i) + " of '" + pattern + "': expected " +
             (ch == 'S' ? "an S" : "an s");
    }
  }
  return "";
}

struct Case {
  const char* pattern;
  std::vector<int> misuses;
};

TEST(StepCounter, AdmissiblePatternsWithJ3) {
  for (const char* p : {"FFFS", "FsFsFS", "FFsFS", "FsFFS", "FFFS FFFS", "FsFsFS FFsFS"}) {
    auto c = StepCounter::Create(3, StepCounter::Counts::kForward);
    ASSERT_TRUE(c.ok());
    std::vector<int> misuses;
    EXPECT_EQ(RunPattern(*c, p, &misuses), "") << p;
    EXPECT_TRUE(misuses.empty()) << p;
  }
}

TEST(StepCounter, InadmissiblePatternsWarnAtTheRightComputation) {
  for (const Case& k : {Case{"FFFFS", {4}}, Case{"FFsFFS", {4}}, Case{"FFFFFS", {4, 5}},
                        Case{"FFsFFFS", {4, 5}}, Case{"FFFFS FFFS", {4}}}) {
    auto c = StepCounter::Create(3, StepCounter::Counts::kBackward);
    ASSERT_TRUE(c.ok());
    std::vector<int> misuses;
    EXPECT_EQ(RunPattern(*c, k.pattern, &misuses), "") << k.pattern;
    EXPECT_EQ(misuses, k.misuses) << k.pattern;
  }
}

TEST(StepCounter, TheDriftingCaseIsSilent) {
  // J = 3, four mini-batches per batch, a step after each: communication drifts to the
  // second mini-batch of the second batch, and nothing warns (docs/optim.md, rule 5).
  auto c = StepCounter::Create(3, StepCounter::Counts::kForward);
  ASSERT_TRUE(c.ok());
  std::vector<int> misuses;
  EXPECT_EQ(RunPattern(*c, "FsFsFSFs FsFSFsFs", &misuses), "");
  EXPECT_TRUE(misuses.empty());
}

TEST(StepCounter, JOfOneCommunicatesAtEveryStep) {
  auto c = StepCounter::Create(1, StepCounter::Counts::kForward);
  ASSERT_TRUE(c.ok());
  std::vector<int> misuses;
  EXPECT_EQ(RunPattern(*c, "FSFSFSs", &misuses), "");
  EXPECT_EQ(RunPattern(*c, "FFS", &misuses), "");
  EXPECT_EQ(misuses, std::vector<int>{2});  // numbered within the second pattern
}

TEST(StepCounter, UncountedComputationsChangeNothing) {
  auto c = StepCounter::Create(2, StepCounter::Counts::kForward);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c->OnComputation(0, /*counted=*/false), Event::kIgnored);
  EXPECT_EQ(c->countdown(0), 2);
  EXPECT_EQ(c->computations(), 0);
  EXPECT_EQ(*c->OnComputation(), Event::kCounted);
  EXPECT_EQ(*c->OnComputation(0, false), Event::kIgnored);
  EXPECT_EQ(*c->OnComputation(), Event::kCommunicate);
  EXPECT_EQ(*c->OnComputation(0, false), Event::kIgnored);  // no misuse either
  EXPECT_TRUE(*c->OnStep());
}

TEST(StepCounter, StepBeforeAnyComputationIsAnError) {
  for (auto counts : {StepCounter::Counts::kForward, StepCounter::Counts::kBackward}) {
    auto c = StepCounter::Create(1, counts);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(c->OnComputation(0, false).ok());  // under no-grad: still nothing counted
    auto s = c->OnStep();
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
    const std::string what = counts == StepCounter::Counts::kForward ? "forward" : "backward";
    EXPECT_NE(std::string(s.status().message()).find("before any counted " + what),
              std::string::npos)
        << s.status();
    // Once something was counted, a step with nothing new is a plain s.
    ASSERT_TRUE(c->OnComputation().ok());
    EXPECT_TRUE(*c->OnStep());
    EXPECT_FALSE(*c->OnStep());
  }
}

TEST(StepCounter, BadArguments) {
  EXPECT_EQ(StepCounter::Create(0, StepCounter::Counts::kForward).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(StepCounter::Create(-2, StepCounter::Counts::kForward)
                            .status()
                            .message())
                .find("num_steps_per_communication must be at least 1, got -2"),
            std::string::npos);
  EXPECT_FALSE(StepCounter::Create(1, StepCounter::Counts::kForward, 0).ok());
  auto c = StepCounter::Create(2, StepCounter::Counts::kBackward, 2);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->OnComputation(2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c->OnComputation(-1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(c->set_steps_per_communication(0).ok());
  EXPECT_EQ(c->steps_per_communication(), 2);
}

TEST(StepCounter, TheWarningSaysWhatWasExpectedAndWhichKnob) {
  auto c = StepCounter::Create(2, StepCounter::Counts::kBackward);
  ASSERT_TRUE(c.ok());
  c->OnComputation().IgnoreError();
  c->OnComputation().IgnoreError();
  ASSERT_EQ(*c->OnComputation(), Event::kMisuse);
  const std::string w = c->MisuseWarning();
  for (const char* part : {"backward computation just counted is number 3",
                           "expected a step() after 2 counted backward computations",
                           "does not matter", "num_steps_per_communication"}) {
    EXPECT_NE(w.find(part), std::string::npos) << part << " in: " << w;
  }
  EXPECT_EQ(w.find("forward"), std::string::npos) << w;
}

TEST(StepCounter, UnitsCountDownSeparatelyAndAPassWarnsOnce) {
  // Three parameters, backward counting, J = 2.
  auto c = StepCounter::Create(2, StepCounter::Counts::kBackward, 3);
  ASSERT_TRUE(c.ok());
  for (int u : {2, 1, 0}) EXPECT_EQ(*c->OnComputation(u), Event::kCounted);
  EXPECT_FALSE(*c->OnStep());
  for (int u : {2, 1}) EXPECT_EQ(*c->OnComputation(u), Event::kCommunicate);
  EXPECT_TRUE(c->launched(1));
  EXPECT_FALSE(c->launched(0));
  EXPECT_EQ(*c->OnComputation(0), Event::kCommunicate);
  // A third pass before the step: one warning, from the first unit that sees it.
  EXPECT_EQ(*c->OnComputation(1), Event::kMisuse);
  EXPECT_EQ(*c->OnComputation(0), Event::kCounted);
  EXPECT_EQ(*c->OnComputation(2), Event::kCounted);
  EXPECT_EQ(*c->OnComputation(2), Event::kMisuse);  // a fourth pass warns again
  EXPECT_EQ(c->computations(), 4);
  EXPECT_TRUE(*c->OnStep());
  for (int u = 0; u < 3; ++u) EXPECT_EQ(c->countdown(u), 2);
  // A unit that never reached 0 (an unused parameter) does not hold back the S.
  EXPECT_EQ(*c->OnComputation(0), Event::kCounted);
  EXPECT_EQ(*c->OnComputation(0), Event::kCommunicate);
  EXPECT_FALSE(c->launched(1));
  EXPECT_TRUE(*c->OnStep());
}

TEST(StepCounter, ChangingJTakesEffectAtTheNextRound) {
  auto c = StepCounter::Create(3, StepCounter::Counts::kForward);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c->set_steps_per_communication(2).ok());  // nothing counted: at once
  std::vector<int> misuses;
  EXPECT_EQ(RunPattern(*c, "FFS", &misuses), "");
  EXPECT_EQ(RunPattern(*c, "F", &misuses), "");
  ASSERT_TRUE(c->set_steps_per_communication(1).ok());  // mid-round: from the next S
  EXPECT_EQ(c->steps_per_communication(), 2);
  EXPECT_EQ(RunPattern(*c, "sFS FS FS", &misuses), "");
  EXPECT_TRUE(misuses.empty());
}

// The rules of docs/optim.md written out plainly for one unit, to compare with the counter on
// generated sequences.
struct Reference {
  int64_t j;
  int64_t countdown;
  bool any = false;
  // Returns the event for a computation.
  Event Compute(bool counted) {
    if (!counted) return Event::kIgnored;
    any = true;
    if (countdown == 0) return Event::kMisuse;
    --countdown;
    return countdown == 0 ? Event::kCommunicate : Event::kCounted;
  }
  // -1: error (no computation yet), 1: S, 0: s.
  int Step() {
    if (!any) return -1;
    if (countdown != 0) return 0;
    countdown = j;
    return 1;
  }
};

TEST(StepCounter, AgreesWithTheReferenceOnRandomSequences) {
  std::mt19937 rng(20261129);
  int misuses = 0, communications = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int64_t j = 1 + static_cast<int64_t>(rng() % 5);
    // Several units fed as whole passes (every unit, in a random order) behave as one.
    const int units = 1 + static_cast<int>(rng() % 3);
    auto c = StepCounter::Create(j, StepCounter::Counts::kBackward, units);
    ASSERT_TRUE(c.ok());
    Reference ref{j, j};
    std::vector<int> order(static_cast<size_t>(units));
    for (int u = 0; u < units; ++u) order[static_cast<size_t>(u)] = u;
    for (int op = 0; op < 60; ++op) {
      const unsigned r = rng() % 10;
      if (r < 6) {
        const bool counted = r != 0;
        const Event want = ref.Compute(counted);
        std::shuffle(order.begin(), order.end(), rng);
        bool warned = false, launched = false;
        for (int u : order) {
          auto e = c->OnComputation(u, counted);
          ASSERT_TRUE(e.ok());
          warned |= *e == Event::kMisuse;
          launched |= *e == Event::kCommunicate;
          if (!counted) {
            ASSERT_EQ(*e, Event::kIgnored);
          }
        }
        ASSERT_EQ(warned, want == Event::kMisuse) << "trial " << trial << " op " << op;
        ASSERT_EQ(launched, want == Event::kCommunicate) << "trial " << trial << " op " << op;
        misuses += warned;
        communications += launched;
        for (int u = 0; u < units; ++u) ASSERT_EQ(c->countdown(u), ref.countdown);
      } else {
        const int want = ref.Step();
        auto s = c->OnStep();
        if (want < 0) {
          ASSERT_FALSE(s.ok());
        } else {
          ASSERT_TRUE(s.ok());
          ASSERT_EQ(*s, want == 1) << "trial " << trial << " op " << op;
        }
      }
    }
  }
  // The generator reaches every kind of event.
  EXPECT_GT(misuses, 100);
  EXPECT_GT(communications, 1000);
}

}  // namespace
}  // namespace weft
