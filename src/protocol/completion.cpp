#include "protocol/completion.h"

#include <fmt/format.h>

#include <random>

#include "core/error.h"

namespace di::protocol {

StopCause stop_cause(recipe::FinishReason parser_reason, bool stop_sequence_matched) {
  switch (parser_reason) {
    case recipe::FinishReason::kToolCalls: return StopCause::kToolCalls;
    case recipe::FinishReason::kLength: return StopCause::kLength;
    case recipe::FinishReason::kStop: return stop_sequence_matched ? StopCause::kStopSequence : StopCause::kEndTurn;
  }
  return StopCause::kEndTurn;
}

const char* openai_finish_reason(StopCause cause) {
  switch (cause) {
    case StopCause::kEndTurn:
    case StopCause::kStopSequence: return "stop";
    case StopCause::kLength: return "length";
    case StopCause::kToolCalls: return "tool_calls";
  }
  return "stop";
}

const char* anthropic_stop_reason(StopCause cause) {
  switch (cause) {
    case StopCause::kEndTurn: return "end_turn";
    case StopCause::kStopSequence: return "stop_sequence";
    case StopCause::kLength: return "max_tokens";
    case StopCause::kToolCalls: return "tool_use";
  }
  return "end_turn";
}

void CompletionBuilder::add(const recipe::ParserEvent& e) {
  using T = recipe::ParserEvent::Type;
  switch (e.type) {
    case T::kReasoningDelta: c_.reasoning += e.text; break;
    case T::kContentDelta: c_.content += e.text; break;
    case T::kToolCallStart:
      DI_CHECK(e.tool_index == static_cast<int>(c_.tool_calls.size()),
               "tool call {} started after {} calls", e.tool_index, c_.tool_calls.size());
      c_.tool_calls.push_back({e.tool_call_id, e.tool_name, ""});
      break;
    case T::kToolCallArgumentsDelta:
      DI_CHECK(e.tool_index >= 0 && e.tool_index < static_cast<int>(c_.tool_calls.size()),
               "arguments for unknown tool call {}", e.tool_index);
      c_.tool_calls[static_cast<size_t>(e.tool_index)].arguments += e.text;
      break;
    case T::kFinish: break;
  }
}

std::string random_id(std::string_view prefix) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  return fmt::format("{}{:016x}{:08x}", prefix, rng(), static_cast<uint32_t>(rng()));
}

}  // namespace di::protocol
