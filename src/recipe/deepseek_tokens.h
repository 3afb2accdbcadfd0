#pragma once
// DeepSeek control-token spellings (fullwidth ｜ U+FF5C, ▁ U+2581) and their ids in a given tokenizer.
#include <string_view>

#include "recipe/renderer.h"

namespace di::recipe {

namespace deepseek {
inline constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
inline constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
inline constexpr std::string_view kUser = "<｜User｜>";
inline constexpr std::string_view kAssistant = "<｜Assistant｜>";
inline constexpr std::string_view kThinkBegin = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";
inline constexpr std::string_view kCallsBegin = "<｜tool▁calls▁begin｜>";
inline constexpr std::string_view kCallsEnd = "<｜tool▁calls▁end｜>";
inline constexpr std::string_view kCallBegin = "<｜tool▁call▁begin｜>";
inline constexpr std::string_view kCallEnd = "<｜tool▁call▁end｜>";
inline constexpr std::string_view kToolSep = "<｜tool▁sep｜>";
inline constexpr std::string_view kOutputsBegin = "<｜tool▁outputs▁begin｜>";
inline constexpr std::string_view kOutputsEnd = "<｜tool▁outputs▁end｜>";
inline constexpr std::string_view kOutputBegin = "<｜tool▁output▁begin｜>";
inline constexpr std::string_view kOutputEnd = "<｜tool▁output▁end｜>";
inline constexpr std::string_view kDsml = "｜DSML｜";
}  // namespace deepseek

struct DeepSeekTokens {
  TokenId bos = -1, eos = -1, user = -1, assistant = -1;
  TokenId calls_begin = -1, calls_end = -1, call_begin = -1, call_end = -1, sep = -1;
  TokenId outputs_begin = -1, outputs_end = -1, output_begin = -1, output_end = -1;
  TokenId think_begin = -1, think_end = -1;  // V3.1 and later (required there), -1 for V3
  TokenId dsml = -1;                         // V3.2 and V4 (required there)

  // Throws di::Error naming the first spelling the tokenizer lacks.
  static DeepSeekTokens lookup(const Tokenizer& tokenizer, ChatFamily family);
};

}  // namespace di::recipe
