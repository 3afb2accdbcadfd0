#pragma once
// Output-length defaults for requests that set no max_tokens.
#include <cstdint>
#include <optional>

#include "recipe/conversation.h"

namespace di::recipe {

inline constexpr int64_t kDefaultMaxTokens = 8192;              // thinking off
inline constexpr int64_t kDefaultMaxTokensThinking = 65536;     // thinking on
inline constexpr int64_t kDefaultMaxTokensMaxEffort = 131072;   // thinking on at ReasoningEffort::kMax

// The request's own value when set, otherwise the default for its thinking mode and effort.
int64_t resolve_max_tokens(std::optional<int64_t> requested, bool thinking, ReasoningEffort effort);

}  // namespace di::recipe
