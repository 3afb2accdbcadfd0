#include <gtest/gtest.h>

#include "scheduler/stop_checker.h"

namespace di {
namespace {

struct Outcome {
  std::string text;
  bool stopped = false;
  size_t stop_offset = 0;
  bool operator==(const Outcome&) const = default;
};

Outcome feed(const std::vector<std::string>& stops, const std::vector<std::string>& chunks,
             bool include = false) {
  StopChecker c(stops, include);
  Outcome o;
  for (const std::string& chunk : chunks) {
    StopChecker::Result r = c.append(chunk);
    o.text += r.text;
    if (r.stopped) {
      o.stopped = true;
      o.stop_offset = r.stop_offset;
    }
  }
  if (!o.stopped) o.text += c.flush();
  return o;
}

TEST(StopChecker, HoldsBackAPossiblePrefixAndStopsAcrossChunks) {
  StopChecker c({"END"});
  StopChecker::Result r1 = c.append("abcE");
  EXPECT_EQ(r1.text, "abc");
  EXPECT_FALSE(r1.stopped);
  StopChecker::Result r2 = c.append("N");
  EXPECT_EQ(r2.text, "");
  StopChecker::Result r3 = c.append("Dxyz");
  EXPECT_TRUE(r3.stopped);
  EXPECT_EQ(r3.text, "");
  EXPECT_EQ(r3.stop_offset, 3u);
  EXPECT_TRUE(c.stopped());
  EXPECT_EQ(c.append("more").text, "");
}

TEST(StopChecker, ReleasesAFalseAlarm) {
  StopChecker c({"END"});
  EXPECT_EQ(c.append("xEN").text, "x");
  EXPECT_EQ(c.append("O").text, "ENO");
  EXPECT_EQ(c.append("E").text, "");
  EXPECT_EQ(c.flush(), "E");
  EXPECT_EQ(c.num_emitted(), 5u);
}

TEST(StopChecker, EarliestMatchWinsAndIncludeKeepsTheStopString) {
  EXPECT_EQ(feed({"world", "lo w"}, {"hello world"}), (Outcome{"hel", true, 3}));
  EXPECT_EQ(feed({"ab", "abc"}, {"xxabc"}), (Outcome{"xx", true, 2}));
  EXPECT_EQ(feed({"ab", "abc"}, {"xxabc"}, true), (Outcome{"xxabc", true, 5}));
  EXPECT_EQ(feed({"</s>"}, {"a</", "s", ">b"}, true), (Outcome{"a</s>", true, 5}));
  EXPECT_EQ(feed({}, {"a", "b"}), (Outcome{"ab", false, 0}));
  EXPECT_EQ(feed({""}, {"a", "b"}), (Outcome{"ab", false, 0}));  // empty stops are ignored
}

// Differential: every way of cutting the text into three chunks gives the same outcome.
TEST(StopChecker, EveryChunkingAgrees) {
  const std::vector<std::vector<std::string>> stop_sets{{"aab"}, {"ab", "ba"}, {"xyz"}, {"aaaa"}};
  const std::vector<std::string> texts{"aaab", "abab", "zzaaaaz", "aabaab", "qqq", "baaaa"};
  for (const auto& stops : stop_sets) {
    for (const std::string& text : texts) {
      Outcome whole = feed(stops, {text});
      for (size_t i = 0; i <= text.size(); ++i) {
        for (size_t j = i; j <= text.size(); ++j) {
          Outcome cut = feed(stops, {text.substr(0, i), text.substr(i, j - i), text.substr(j)});
          EXPECT_EQ(cut, whole) << "text " << text << " cut at " << i << "," << j;
        }
      }
      // Byte by byte, too.
      std::vector<std::string> bytes;
      for (char ch : text) bytes.emplace_back(1, ch);
      EXPECT_EQ(feed(stops, bytes), whole) << text;
    }
  }
}

}  // namespace
}  // namespace di
