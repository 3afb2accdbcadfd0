#pragma once
// Element types and their conversions to and from fp32.
//   bf16: 1-8-7, round-to-nearest-even from fp32.
//   f16:  IEEE 754 half (1-5-10).
//   fp8_e4m3: OCP E4M3FN (bias 7, no infinities, S.1111.111 is NaN, max finite 448), saturating.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace di {

enum class DType : uint8_t { kF32, kBF16, kF16, kFP8E4M3, kI32, kI64, kU8 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
// Parses our names (f32, bf16, f16, fp8_e4m3, i32, i64, u8) and safetensors names (F32, BF16, ...).
bool parse_dtype(std::string_view name, DType* out);

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float fp8e4m3_to_f32(uint8_t v);
uint8_t f32_to_fp8e4m3(float f);

// Converts n elements of type `from` at src into fp32 at dst.
void convert_to_f32(DType from, const void* src, float* dst, size_t n);
// Converts n fp32 values into type `to` at dst.
void convert_from_f32(DType to, const float* src, void* dst, size_t n);

}  // namespace di
