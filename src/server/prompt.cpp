#include "server/prompt.h"

#include <fmt/format.h>

#include "protocol/api_error.h"
#include "recipe/limits.h"

namespace di::server {

std::vector<int32_t> build_prompt(const ServedModel& model, const protocol::ParsedRequest& request) {
  std::vector<int32_t> ids;
  if (request.api == protocol::Api::kCompletions) {
    if (request.prompt_is_ids) {
      const int32_t vocab = model.tokenizer->vocab_size();
      for (int32_t id : request.prompt_ids) {
        if (id >= vocab) protocol::throw_invalid(fmt::format("token id {} is outside the vocabulary ({} ids)", id, vocab), "prompt");
      }
      return request.prompt_ids;
    }
    if (model.bos) ids.push_back(*model.bos);
    std::vector<int32_t> text_ids = model.tokenizer->encode_with_special(request.prompt_text);
    ids.insert(ids.end(), text_ids.begin(), text_ids.end());
    return ids;
  }
  std::vector<recipe::Segment> segments;
  try {
    segments = model.renderer->render(request.conversation);
  } catch (const std::exception& e) {
    // The family cannot express this conversation (e.g. tool calls for Llama 3).
    protocol::throw_invalid(fmt::format("this conversation cannot be rendered for {}: {}",
                                        recipe::chat_family_name(model.family), e.what()),
                            "messages");
  }
  return recipe::encode_segments(*model.tokenizer, segments).ids;
}

int64_t default_max_tokens(const ServedModel& model, const protocol::ParsedRequest& request) {
  if (request.api == protocol::Api::kCompletions) return 16;
  const bool thinking = request.conversation.thinking_enabled(model.family == recipe::ChatFamily::kQwen3);
  return recipe::resolve_max_tokens(std::nullopt, thinking, request.conversation.settings.effort);
}

}  // namespace di::server
