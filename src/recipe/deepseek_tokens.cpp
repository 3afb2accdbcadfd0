#include "recipe/deepseek_tokens.h"

namespace di::recipe {

DeepSeekTokens DeepSeekTokens::lookup(const Tokenizer& tok, ChatFamily family) {
  using namespace deepseek;
  DeepSeekTokens t;
  const auto req = [&](std::string_view s) { return require_token(tok, s, family); };
  t.bos = req(kBos);
  t.eos = req(kEos);
  t.user = req(kUser);
  t.assistant = req(kAssistant);
  const bool dsml = family == ChatFamily::kDeepSeekV32 || family == ChatFamily::kDeepSeekV4;
  if (!dsml) {
    t.calls_begin = req(kCallsBegin);
    t.calls_end = req(kCallsEnd);
    t.call_begin = req(kCallBegin);
    t.call_end = req(kCallEnd);
    t.sep = req(kToolSep);
    t.outputs_begin = req(kOutputsBegin);
    t.outputs_end = req(kOutputsEnd);
    t.output_begin = req(kOutputBegin);
    t.output_end = req(kOutputEnd);
  }
  if (family != ChatFamily::kDeepSeekV3) {
    t.think_begin = req(kThinkBegin);
    t.think_end = req(kThinkEnd);
  }
  if (dsml) t.dsml = req(kDsml);
  return t;
}

}  // namespace di::recipe
