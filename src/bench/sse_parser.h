#pragma once
// Incremental Server-Sent Events parser (the WHATWG "event stream" format): bytes arrive in
// arbitrary pieces — a line, an event or a UTF-8 character may be split anywhere — and complete
// events come out in order.
//
//   lines end in "\n", "\r\n" or "\r" (a "\r" at the end of one piece may pair with a "\n" at the
//   start of the next); "field: value" drops one space after the colon; lines starting with ":"
//   are comments; several "data" lines join with "\n"; a blank line dispatches the event, and an
//   event without data lines is not dispatched.
#include <functional>
#include <string>
#include <string_view>

namespace di::bench {

struct SseEvent {
  std::string event;  // "event:" field, "" when absent
  std::string data;
  std::string id;
};

class SseParser {
 public:
  using Callback = std::function<void(const SseEvent&)>;
  explicit SseParser(Callback on_event) : on_event_(std::move(on_event)) {}

  void feed(std::string_view bytes);
  // End of stream: a last event whose blank line never came is still dispatched (servers that
  // close right after "data: [DONE]\n" are common).
  void finish();

 private:
  void process_line(std::string_view line);
  void dispatch();

  Callback on_event_;
  std::string line_;  // the current, unterminated line
  bool last_was_cr_ = false;
  SseEvent pending_;
  bool has_data_ = false;
};

}  // namespace di::bench
