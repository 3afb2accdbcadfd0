#pragma once
// Rotary position embedding tables, computed as Hugging Face transformers 5.x does for the rope
// types we support (default, linear, llama3, yarn).
#include <vector>

#include "model/config.h"
#include "tensor/tensor.h"

namespace di {

struct RopeTable {
  std::vector<double> inv_freq;   // [rot_dim / 2]
  double attention_factor = 1.0;  // multiplies cos and sin (YaRN)
};

RopeTable compute_rope(const RopeConfig& rope, int64_t rot_dim, int64_t max_position_embeddings);

// [max_pos, rot_dim] f32: for each position, cos of the rot_dim/2 frequencies, then their sin,
// both times attention_factor.
Tensor make_cos_sin_table(const RopeTable& table, int64_t max_pos);

}  // namespace di
