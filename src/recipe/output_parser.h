#pragma once
// Streaming output parsers: generated token ids → reasoning / content / tool-call events.
//
//   auto parser = make_output_parser(ChatFamily::kDeepSeekV31, tokenizer, options);
//   parser->feed(ids_chunk, events);          // any chunking, including one id at a time
//   parser->finish(FinishReason::kStop, events);
//
// Invariants:
//  - Chunk-split invariance: every split of the same ids gives the same events once adjacent deltas of
//    the same kind (and tool index) are merged (coalesce_events).
//  - Text is emitted as complete UTF-8 only; bytes of a character still being generated are held back.
//  - Single-token markers (</think>, <｜tool▁call▁begin｜>, <tool_call>, …) are recognised by id, so
//    text that merely spells them is content. Multi-token markup (DSML, the fence of V3 tool calls) is
//    matched on decoded text and only a possible marker prefix is held back.
//  - Arguments stream as they arrive: each delta is a fragment of the call's JSON arguments text; the
//    concatenation of a call's deltas is the complete JSON text.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "recipe/renderer.h"

namespace di::recipe {

enum class FinishReason { kStop, kLength, kToolCalls };
const char* finish_reason_name(FinishReason reason);  // "stop", "length", "tool_calls"

struct ParserEvent {
  enum class Type { kReasoningDelta, kContentDelta, kToolCallStart, kToolCallArgumentsDelta, kFinish };
  Type type = Type::kContentDelta;
  std::string text;          // deltas: the text; kToolCallStart: unused
  int tool_index = -1;       // tool-call events: 0-based index of the call in this response
  std::string tool_call_id;  // kToolCallStart
  std::string tool_name;     // kToolCallStart
  FinishReason finish_reason = FinishReason::kStop;  // kFinish

  bool operator==(const ParserEvent&) const = default;
};

const char* event_type_name(ParserEvent::Type type);
std::string to_string(const ParserEvent& e);  // one line, for test failure messages

// Merges adjacent deltas of the same type (and tool index); drops empty deltas.
std::vector<ParserEvent> coalesce_events(const std::vector<ParserEvent>& events);

// Produces the id of each new tool call (argument: its 0-based index in the response).
using ToolCallIdGenerator = std::function<std::string(int tool_index)>;
// "call_0", "call_1", …
ToolCallIdGenerator sequential_tool_call_ids(std::string prefix = "call_");
// "call_" + 24 hex digits from a SplitMix64 stream seeded with `seed`: unique-looking and reproducible.
ToolCallIdGenerator seeded_tool_call_ids(uint64_t seed);

struct ParserOptions {
  bool starts_in_reasoning = false;  // the prompt ended inside a reasoning block (e.g. "<｜Assistant｜><think>")
  bool parse_tool_calls = true;      // false: tool markup is content
  ToolCallIdGenerator tool_call_ids;  // default: sequential_tool_call_ids()
};

class OutputParser {
 public:
  virtual ~OutputParser() = default;
  // Appends the events the new ids complete. Ids after a stop token are ignored.
  virtual void feed(std::span<const TokenId> ids, std::vector<ParserEvent>& out) = 0;
  // Flushes held-back text and appends kFinish. `engine_reason` is kStop (a stop token or stop
  // sequence ended generation) or kLength; kStop becomes kToolCalls when a tool call was emitted.
  virtual void finish(FinishReason engine_reason, std::vector<ParserEvent>& out) = 0;
  // True once a stop token was fed.
  virtual bool stopped() const = 0;
};

std::unique_ptr<OutputParser> make_output_parser(ChatFamily family, std::shared_ptr<const Tokenizer> tokenizer,
                                                 ParserOptions options = {});

// Options matching a rendered conversation (reasoning start state from the renderer).
ParserOptions parser_options_for(const Renderer& renderer, const Conversation& conv);

}  // namespace di::recipe
