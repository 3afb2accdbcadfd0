#pragma once
// The ceilings the kernel benchmarks report against, measured on the H200 (design.md §5).
namespace di::bench {

inline constexpr double kCopyBw = 4.28e12;    // bytes/s, device-to-device copy
inline constexpr double kPeakFlops = 787e12;  // FLOP/s, cuBLAS bf16 at 8192^3

}  // namespace di::bench
