#pragma once
// Constructors of the architecture families (one file each), used by load_model().
#include <memory>

#include "model/model.h"
#include "model/safetensors.h"

namespace di {

// LlamaForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM (llama.cpp).
std::unique_ptr<Model> make_gqa_model(const ModelConfig& config, Backend& backend,
                                      const Checkpoint& ck, const LoadOptions& opts);
// DeepseekV2ForCausalLM, DeepseekV3ForCausalLM (deepseek_v3.cpp).
std::unique_ptr<Model> make_mla_model(const ModelConfig& config, Backend& backend,
                                      const Checkpoint& ck, const LoadOptions& opts);

}  // namespace di
