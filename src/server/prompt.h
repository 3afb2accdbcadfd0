#pragma once
// Parsed request → prompt token ids, on the HTTP worker (never on the engine thread).
#include <cstdint>
#include <vector>

#include "protocol/request.h"
#include "server/model_info.h"

namespace di::server {

// Chat-shaped APIs: render with the model family's renderer, encode text with the base vocabulary
// only (user text can never forge a control token). /v1/completions: the client owns the whole
// prompt, so its text is encoded with added tokens recognised, after the BOS the tokenizer config
// asks for; token-id prompts are checked against the vocabulary. Throws ApiException (400).
std::vector<int32_t> build_prompt(const ServedModel& model, const protocol::ParsedRequest& request);

// max_tokens when the request sets none: recipe/limits.h for chat-shaped APIs (larger with thinking).
int64_t default_max_tokens(const ServedModel& model, const protocol::ParsedRequest& request);

}  // namespace di::server
