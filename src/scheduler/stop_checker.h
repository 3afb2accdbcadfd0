#pragma once
// StopChecker: stop strings on detokenized text, which the scheduler does not have. The caller
// feeds each sequence's newly decoded text; the checker emits what is safe to stream and holds
// back the longest tail that could still grow into a stop string, so a stop string split across
// any number of chunks is found and never streamed. Stop token ids and max_tokens are checked on
// ids by the Scheduler.
//
//   stop "END":   append("abcE") -> "abc" (holds "E")   append("NDxyz") -> stopped, ""
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace di {

class StopChecker {
 public:
  // Empty stop strings are ignored (they would match everywhere).
  explicit StopChecker(std::vector<std::string> stop_strings, bool include_stop_string = false);

  struct Result {
    std::string text;        // safe to stream now
    bool stopped = false;    // a stop string matched: finish the sequence with kStop
    size_t stop_offset = 0;  // when stopped: bytes of output text kept (the truncation point)
  };

  // Appends newly decoded text. After a stop, further text is ignored.
  Result append(std::string_view new_text);
  // The sequence ended without a stop string: releases the held-back tail.
  std::string flush();

  bool stopped() const { return stopped_; }
  size_t num_emitted() const { return num_emitted_; }

 private:
  std::vector<std::string> stops_;
  bool include_stop_string_;
  std::string pending_;  // received but not emitted: a possible prefix of a stop string
  size_t num_emitted_ = 0;
  bool stopped_ = false;
};

}  // namespace di
