#include "tensor/dtype.h"

#include <cmath>

#include "core/error.h"

namespace di {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kFP8E4M3: return 1;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kFP8E4M3: return "fp8_e4m3";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
  }
  return "?";
}

bool parse_dtype(std::string_view name, DType* out) {
  struct Entry {
    std::string_view a, b;
    DType t;
  };
  static constexpr Entry kTable[] = {
      {"f32", "F32", DType::kF32},          {"bf16", "BF16", DType::kBF16},
      {"f16", "F16", DType::kF16},          {"fp8_e4m3", "F8_E4M3", DType::kFP8E4M3},
      {"i32", "I32", DType::kI32},          {"i64", "I64", DType::kI64},
      {"u8", "U8", DType::kU8},
  };
  for (const auto& e : kTable) {
    if (name == e.a || name == e.b) {
      *out = e.t;
      return true;
    }
  }
  if (name == "float32") return *out = DType::kF32, true;
  if (name == "bfloat16") return *out = DType::kBF16, true;
  if (name == "float16") return *out = DType::kF16, true;
  return false;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    v = mant ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow → inf
  if (absx < 0x38800000u) {  // subnormal or zero in f16: round to multiple of 2^-24
    float a;
    std::memcpy(&a, &absx, 4);
    float scaled = a * 16777216.0f;  // 2^24; exact, then RNE through nearbyint
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
  }
  uint32_t mant_odd = (absx >> 13) & 1u;
  absx += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
  return static_cast<uint16_t>(sign | (absx >> 13));
}

float fp8e4m3_to_f32(uint8_t v) {
  uint32_t sign = v >> 7, exp = (v >> 3) & 0xfu, mant = v & 0x7u;
  float r;
  if (exp == 15 && mant == 7) return NAN;
  if (exp == 0) {
    r = std::ldexp(static_cast<float>(mant), -9);  // 2^-6 * mant/8
  } else {
    r = std::ldexp(static_cast<float>(mant | 8u), static_cast<int>(exp) - 10);
  }
  return sign ? -r : r;
}

uint8_t f32_to_fp8e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;  // saturate to max finite
  // Search by rounding: values are few (126 finite positive); compute exponent directly.
  if (a < std::ldexp(1.0f, -6)) {  // subnormal: multiples of 2^-9
    int m = static_cast<int>(std::nearbyint(a * 512.0f));
    if (m == 8) return sign | 0x08;  // rounds up into the smallest normal
    return static_cast<uint8_t>(sign | m);
  }
  int e;
  float frac = std::frexp(a, &e);  // a = frac * 2^e, frac in [0.5, 1)
  int exp = e - 1 + 7;             // biased exponent of 1.xxx form
  float mant_f = (frac * 2.0f - 1.0f) * 8.0f;
  int mant = static_cast<int>(std::nearbyint(mant_f));
  if (mant == 8) {
    mant = 0;
    ++exp;
  }
  if (exp > 15 || (exp == 15 && mant == 7)) return sign | 0x7e;
  return static_cast<uint8_t>(sign | (exp << 3) | mant);
}

void convert_to_f32(DType from, const void* src, float* dst, size_t n) {
  switch (from) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::kFP8E4M3: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = fp8e4m3_to_f32(s[i]);
      return;
    }
    default:
      DI_FAIL("cannot convert {} to f32", dtype_name(from));
  }
}

void convert_from_f32(DType to, const float* src, void* dst, size_t n) {
  switch (to) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::kFP8E4M3: {
      auto* d = static_cast<uint8_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_fp8e4m3(src[i]);
      return;
    }
    default:
      DI_FAIL("cannot convert f32 to {}", dtype_name(to));
  }
}

}  // namespace di
