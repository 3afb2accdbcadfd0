#pragma once
// Benchmark datasets: the requests a load generator sends, with their prompt lengths measured by
// the real tokenizer.
//
//   random     independent prompts of exactly --input-len tokens (uniform in
//              [len*(1-r), len*(1+r)] with --range-ratio r), optionally after a prefix shared by
//              every request (--shared-prefix-len)
//   multiturn  chat sessions: turn k's messages = turn k-1's messages + the assistant's reply +
//              a new user message, so each turn's prompt extends the previous one and a prefix
//              cache should serve everything but the new text
//   agent      long-context agent traces: a large first context (system prompt, tool schemas,
//              files), then per turn the model's tool call and a tool result; tens of thousands
//              of tokens per request, most of them reused from the session's previous turn
//   jsonl      a file, one {"prompt": "..."} or {"messages": [...]} object per line, optional
//              "max_tokens" and "session_id" (turns of one session are sent in file order)
//
// The assistant replies inside multiturn / agent histories are synthetic (of --output-len
// tokens), not the server's: every run sends the same bytes, whatever the model says.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/prompt_text.h"

namespace di::bench {

enum class PromptFormat : uint8_t {
  kText,      // /v1/completions: one prompt string (messages joined by kTurnSeparator)
  kMessages,  // /v1/chat/completions: a messages array
};

// Between the messages of a conversation flattened into one completion prompt.
inline constexpr const char* kTurnSeparator = "\n\n";

struct BenchRequest {
  int32_t session_idx = 0;
  int32_t turn_idx = 0;
  nlohmann::json messages = nlohmann::json::array();  // [{"role": ..., "content": ...}, ...]
  std::string prompt;                                 // messages' contents joined (kText)
  int32_t prompt_tokens = 0;  // measured: the prompt (kText) or the sum over message contents
  int32_t max_tokens = 0;
};

struct DatasetOptions {
  std::string name = "random";  // random | multiturn | agent | jsonl
  PromptFormat format = PromptFormat::kText;
  int64_t num_requests = 100;
  uint64_t seed = 0;

  int32_t input_len = 1024;       // random
  int32_t output_len = 128;       // all: max_tokens (jsonl: when a line has none)
  double range_ratio = 0.0;       // random: lengths uniform in [len*(1-r), len*(1+r)]
  int32_t shared_prefix_len = 0;  // random: tokens of a prefix common to every request

  // multiturn / agent; -1 = the dataset's default (multiturn 4 / 512 / 128, agent 8 / 16384 / 1024)
  int32_t turns = -1;        // turns per session
  int32_t context_len = -1;  // tokens of the first turn's context (system prompt, tools, files)
  int32_t turn_len = -1;     // new tokens per turn (user message / tool result)

  std::string path;  // jsonl
};

struct Dataset {
  std::string name;
  PromptFormat format = PromptFormat::kText;
  std::vector<BenchRequest> requests;
  int32_t num_sessions = 0;
  // Random prompts: how many came out at exactly the asked-for length when re-tokenized.
  int64_t num_exact_length = 0;
  int64_t num_length_checked = 0;
  nlohmann::json describe() const;  // options and prompt-length statistics for the results JSON
  nlohmann::json options;
};

Dataset build_dataset(const DatasetOptions& options, PromptTextBuilder& text);

// The completion prompt of a message list: contents joined by kTurnSeparator.
std::string flatten_messages(const nlohmann::json& messages);

}  // namespace di::bench
