#pragma once
// What a finished (or finishing) generation produced, independent of the wire format: reasoning,
// content, tool calls, why it stopped, and token usage. CompletionBuilder folds the output parser's
// events into one; the per-API writers turn it into a response body.
#include <cstdint>
#include <string>
#include <vector>

#include "recipe/conversation.h"
#include "recipe/output_parser.h"

namespace di::protocol {

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;      // prompt tokens served from the prefix cache
  int64_t completion_tokens = 0;
  int64_t reasoning_tokens = 0;   // part of completion_tokens spent inside the reasoning block
};

// Why generation ended, in the terms every API can spell:
//   OpenAI finish_reason  stop | stop | length | tool_calls
//   Anthropic stop_reason end_turn | stop_sequence | max_tokens | tool_use
enum class StopCause { kEndTurn, kStopSequence, kLength, kToolCalls };

// The parser's finish reason plus whether the server cut the text at a stop string.
StopCause stop_cause(recipe::FinishReason parser_reason, bool stop_sequence_matched);
const char* openai_finish_reason(StopCause cause);
const char* anthropic_stop_reason(StopCause cause);

struct Completion {
  std::string reasoning;
  std::string content;
  std::vector<recipe::ToolCall> tool_calls;
  StopCause stop = StopCause::kEndTurn;
  std::string stop_sequence;  // the matched stop string (kStopSequence)
  Usage usage;
};

// Accumulates parser events (deltas and tool-call starts; kFinish is ignored: the caller sets `stop`).
class CompletionBuilder {
 public:
  void add(const recipe::ParserEvent& e);
  Completion& completion() { return c_; }
  const Completion& completion() const { return c_; }

 private:
  Completion c_;
};

// Identity of one response: its id, creation time (Unix seconds) and the model name echoed back.
struct ResponseMeta {
  std::string id;
  int64_t created = 0;
  std::string model;
};

// "chatcmpl-" + 24 random hex digits, and so on.
std::string random_id(std::string_view prefix);

}  // namespace di::protocol
