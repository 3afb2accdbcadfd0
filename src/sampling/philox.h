#pragma once
// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11): a
// counter-based generator. The output is a pure function of (counter, key), so any token's random
// number can be computed on its own, in any order, on the host or on the device.
//
// Sampling keys the generator by the request's seed and counts by the token's position:
//   key     = {seed lo, seed hi}
//   counter = {position lo, position hi, stream, 0}
// so a request's tokens never depend on what else shares its batch. `stream` separates independent
// uses at one position (kStreamSample for the token draw; later ones e.g. for speculative
// verification).
//
// Header-only and usable from CUDA device code (functions are __host__ __device__ under nvcc).
#include <cstdint>

#ifdef __CUDACC__
#define DI_PHILOX_HD __host__ __device__ __forceinline__
#else
#define DI_PHILOX_HD inline
#endif

namespace di::sampling {

struct PhiloxCounter {
  uint32_t v[4];
};
struct PhiloxKey {
  uint32_t v[2];
};

inline constexpr uint32_t kStreamSample = 0;

namespace philox_detail {
inline constexpr uint32_t kM0 = 0xD2511F53u;
inline constexpr uint32_t kM1 = 0xCD9E8D57u;
inline constexpr uint32_t kW0 = 0x9E3779B9u;  // golden ratio
inline constexpr uint32_t kW1 = 0xBB67AE85u;  // sqrt(3) - 1

DI_PHILOX_HD void mulhilo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  *lo = static_cast<uint32_t>(p);
}

DI_PHILOX_HD PhiloxCounter round(PhiloxCounter c, PhiloxKey k) {
  uint32_t hi0, lo0, hi1, lo1;
  mulhilo(kM0, c.v[0], &hi0, &lo0);
  mulhilo(kM1, c.v[2], &hi1, &lo1);
  return PhiloxCounter{{hi1 ^ c.v[1] ^ k.v[0], lo1, hi0 ^ c.v[3] ^ k.v[1], lo0}};
}
}  // namespace philox_detail

// Ten rounds with the key bumped between rounds, as Random123's philox4x32_R(10, ...).
DI_PHILOX_HD PhiloxCounter philox4x32_10(PhiloxCounter counter, PhiloxKey key) {
  counter = philox_detail::round(counter, key);
  for (int r = 1; r < 10; ++r) {
    key.v[0] += philox_detail::kW0;
    key.v[1] += philox_detail::kW1;
    counter = philox_detail::round(counter, key);
  }
  return counter;
}

// The top 24 bits of x as a float in [0, 1): exactly representable, so host and device agree.
DI_PHILOX_HD float u32_to_unit_float(uint32_t x) {
  return static_cast<float>(x >> 8) * (1.0f / 16777216.0f);
}

// Four independent 32-bit words for (seed, position, stream).
DI_PHILOX_HD PhiloxCounter philox_words(uint64_t seed, int64_t position, uint32_t stream) {
  uint64_t pos = static_cast<uint64_t>(position);
  PhiloxCounter c{{static_cast<uint32_t>(pos), static_cast<uint32_t>(pos >> 32), stream, 0u}};
  PhiloxKey k{{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}};
  return philox4x32_10(c, k);
}

// The uniform in [0, 1) that draws the token at `position` of a request seeded with `seed`.
DI_PHILOX_HD float sampling_uniform(uint64_t seed, int64_t position,
                                    uint32_t stream = kStreamSample) {
  return u32_to_unit_float(philox_words(seed, position, stream).v[0]);
}

}  // namespace di::sampling

#undef DI_PHILOX_HD
