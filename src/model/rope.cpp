#include "model/rope.h"

#include <algorithm>
#include <cmath>

namespace di {
namespace {

double yarn_get_mscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

}  // namespace

RopeTable compute_rope(const RopeConfig& rope, int64_t rot_dim, int64_t max_position_embeddings) {
  RopeTable t;
  const int64_t half = rot_dim / 2;
  // HF computes base ** (arange(0, dim, 2) / dim) in fp32; rounding the exponent there keeps the
  // tables bit-close to the reference.
  std::vector<double> pos_freqs(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    float e = static_cast<float>(2 * i) / static_cast<float>(rot_dim);
    pos_freqs[static_cast<size_t>(i)] = std::pow(rope.theta, static_cast<double>(e));
  }
  t.inv_freq.resize(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) t.inv_freq[static_cast<size_t>(i)] = 1.0 / pos_freqs[static_cast<size_t>(i)];

  switch (rope.type) {
    case RopeConfig::Type::kDefault:
      break;
    case RopeConfig::Type::kLinear:
      for (auto& f : t.inv_freq) f /= rope.factor;
      break;
    case RopeConfig::Type::kLlama3: {
      const double old_ctx = static_cast<double>(
          rope.original_max_position_embeddings.value_or(max_position_embeddings));
      const double low_wavelen = old_ctx / rope.low_freq_factor;
      const double high_wavelen = old_ctx / rope.high_freq_factor;
      for (auto& f : t.inv_freq) {
        const double wavelen = 2.0 * M_PI / f;
        if (wavelen > low_wavelen) {
          f = f / rope.factor;
        } else if (wavelen >= high_wavelen) {
          const double smooth =
              (old_ctx / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor);
          f = (1.0 - smooth) * f / rope.factor + smooth * f;
        }
      }
      break;
    }
    case RopeConfig::Type::kYarn: {
      double factor = rope.factor;
      double original = static_cast<double>(max_position_embeddings);
      // As HF: with original_max_position_embeddings given, the factor is the context ratio.
      if (rope.original_max_position_embeddings) {
        original = static_cast<double>(*rope.original_max_position_embeddings);
        factor = static_cast<double>(max_position_embeddings) / original;
      }
      if (rope.attention_factor) {
        t.attention_factor = *rope.attention_factor;
      } else if (rope.mscale && rope.mscale_all_dim && *rope.mscale != 0.0 && *rope.mscale_all_dim != 0.0) {
        t.attention_factor = yarn_get_mscale(factor, *rope.mscale) / yarn_get_mscale(factor, *rope.mscale_all_dim);
      } else {
        t.attention_factor = yarn_get_mscale(factor, 1.0);
      }
      const double base = rope.theta, dim = static_cast<double>(rot_dim);
      auto correction_dim = [&](double rotations) {
        return dim * std::log(original / (rotations * 2.0 * M_PI)) / (2.0 * std::log(base));
      };
      double low = correction_dim(rope.beta_fast), high = correction_dim(rope.beta_slow);
      if (rope.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, dim - 1.0);
      if (low == high) high += 0.001;
      for (int64_t i = 0; i < half; ++i) {
        const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
        const double extrapolation = 1.0 - ramp;
        const double inv_extra = 1.0 / pos_freqs[static_cast<size_t>(i)];
        const double inv_inter = 1.0 / (factor * pos_freqs[static_cast<size_t>(i)]);
        t.inv_freq[static_cast<size_t>(i)] = inv_inter * (1.0 - extrapolation) + inv_extra * extrapolation;
      }
      break;
    }
  }
  // HF stores inv_freq in fp32.
  for (auto& f : t.inv_freq) f = static_cast<double>(static_cast<float>(f));
  return t;
}

Tensor make_cos_sin_table(const RopeTable& table, int64_t max_pos) {
  const int64_t half = static_cast<int64_t>(table.inv_freq.size());
  Tensor out = Tensor::empty({max_pos, 2 * half}, DType::kF32);
  for (int64_t p = 0; p < max_pos; ++p) {
    float* row = out.f32() + p * 2 * half;
    for (int64_t i = 0; i < half; ++i) {
      // HF multiplies fp32 inv_freq by fp32 positions in fp32.
      const float angle = static_cast<float>(table.inv_freq[static_cast<size_t>(i)]) * static_cast<float>(p);
      row[i] = static_cast<float>(std::cos(static_cast<double>(angle)) * table.attention_factor);
      row[half + i] = static_cast<float>(std::sin(static_cast<double>(angle)) * table.attention_factor);
    }
  }
  return out;
}

}  // namespace di
