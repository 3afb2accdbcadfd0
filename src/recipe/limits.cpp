#include "recipe/limits.h"

#include "core/error.h"

namespace di::recipe {

int64_t resolve_max_tokens(std::optional<int64_t> requested, bool thinking, ReasoningEffort effort) {
  if (requested) {
    DI_CHECK(*requested > 0, "max_tokens must be positive, got {}", *requested);
    return *requested;
  }
  if (!thinking || effort == ReasoningEffort::kNone) return kDefaultMaxTokens;
  return effort == ReasoningEffort::kMax ? kDefaultMaxTokensMaxEffort : kDefaultMaxTokensThinking;
}

}  // namespace di::recipe
