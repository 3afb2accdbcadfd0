#include "scheduler/stop_checker.h"

#include <algorithm>

namespace di {

StopChecker::StopChecker(std::vector<std::string> stop_strings, bool include_stop_string)
    : include_stop_string_(include_stop_string) {
  for (std::string& s : stop_strings) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

StopChecker::Result StopChecker::append(std::string_view new_text) {
  Result r;
  if (stopped_) return r;
  pending_.append(new_text);
  // Earliest match wins; at equal positions the longer stop string. `pending_` starts after the
  // emitted text, and no match can start inside emitted text: that text was emitted only because
  // no suffix of it from there on was a stop-string prefix.
  size_t best_pos = std::string::npos;
  size_t best_len = 0;
  for (const std::string& s : stops_) {
    size_t pos = pending_.find(s);
    if (pos < best_pos || (pos == best_pos && pos != std::string::npos && s.size() > best_len)) {
      best_pos = pos;
      best_len = s.size();
    }
  }
  if (best_pos != std::string::npos) {
    r.text = pending_.substr(0, best_pos + (include_stop_string_ ? best_len : 0));
    r.stopped = stopped_ = true;
    num_emitted_ += r.text.size();
    r.stop_offset = num_emitted_;
    pending_.clear();
    return r;
  }
  // Hold back the longest suffix of pending_ that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    for (size_t k = std::min(s.size() - 1, pending_.size()); k > hold; --k) {
      if (std::string_view(pending_).substr(pending_.size() - k) ==
          std::string_view(s).substr(0, k)) {
        hold = k;
        break;
      }
    }
  }
  r.text = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  num_emitted_ += r.text.size();
  return r;
}

std::string StopChecker::flush() {
  std::string out;
  if (stopped_) return out;
  out.swap(pending_);
  num_emitted_ += out.size();
  return out;
}

}  // namespace di
