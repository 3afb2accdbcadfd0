#pragma once
// Test helper: SSE text → frames, checking the framing itself on the way.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "protocol/json_fields.h"

namespace di::protocol::testing {

struct Frame {
  std::string event;  // "" when the frame had no event: line
  std::string data;   // raw data line
  Json json;          // parsed data (null for "[DONE]")
};

inline std::vector<Frame> parse_sse(const std::string& text) {
  std::vector<Frame> frames;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = text.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated frame at " << pos;
    if (end == std::string::npos) break;
    const std::string block = text.substr(pos, end - pos);
    pos = end + 2;
    Frame f;
    size_t line_start = 0;
    while (line_start <= block.size()) {
      size_t nl = block.find('\n', line_start);
      if (nl == std::string::npos) nl = block.size();
      const std::string line = block.substr(line_start, nl - line_start);
      if (line.rfind("event: ", 0) == 0) f.event = line.substr(7);
      else if (line.rfind("data: ", 0) == 0) f.data = line.substr(6);
      else ADD_FAILURE() << "unexpected SSE line: " << line;
      line_start = nl + 1;
    }
    if (f.data != "[DONE]") f.json = Json::parse(f.data);
    frames.push_back(std::move(f));
  }
  return frames;
}

}  // namespace di::protocol::testing
