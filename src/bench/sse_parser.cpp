#include "bench/sse_parser.h"

namespace di::bench {

void SseParser::feed(std::string_view bytes) {
  for (char c : bytes) {
    if (c == '\n' && last_was_cr_) {  // the second half of a "\r\n" split across pieces or not
      last_was_cr_ = false;
      continue;
    }
    last_was_cr_ = false;
    if (c == '\r' || c == '\n') {
      last_was_cr_ = c == '\r';
      process_line(line_);
      line_.clear();
    } else {
      line_.push_back(c);
    }
  }
}

void SseParser::finish() {
  if (!line_.empty()) {
    process_line(line_);
    line_.clear();
  }
  dispatch();
}

void SseParser::process_line(std::string_view line) {
  if (line.empty()) {
    dispatch();
    return;
  }
  if (line.front() == ':') return;  // comment / keep-alive
  std::string_view field = line;
  std::string_view value;
  if (size_t colon = line.find(':'); colon != std::string_view::npos) {
    field = line.substr(0, colon);
    value = line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  }
  if (field == "data") {
    if (has_data_) pending_.data.push_back('\n');
    pending_.data.append(value);
    has_data_ = true;
  } else if (field == "event") {
    pending_.event = value;
  } else if (field == "id") {
    pending_.id = value;
  }  // "retry" and unknown fields are ignored
}

void SseParser::dispatch() {
  if (has_data_) on_event_(pending_);
  pending_ = SseEvent{};
  has_data_ = false;
}

}  // namespace di::bench
