#pragma once
// Constructors of the per-family renderers (one file each); use make_renderer() instead.
#include <memory>

#include "recipe/renderer.h"

namespace di::recipe::detail {

std::unique_ptr<Renderer> make_deepseek_v3_renderer(std::shared_ptr<const Tokenizer> tokenizer);
std::unique_ptr<Renderer> make_deepseek_v31_renderer(std::shared_ptr<const Tokenizer> tokenizer);
std::unique_ptr<Renderer> make_deepseek_dsml_renderer(ChatFamily family, std::shared_ptr<const Tokenizer> tokenizer);
std::unique_ptr<Renderer> make_qwen3_renderer(std::shared_ptr<const Tokenizer> tokenizer);
std::unique_ptr<Renderer> make_llama3_renderer(std::shared_ptr<const Tokenizer> tokenizer);

// All system (and, where the family has no developer role, developer) texts joined by "\n\n".
std::string joined_system_prompt(const Conversation& conv, bool include_developer);

}  // namespace di::recipe::detail
