#pragma once
// Canonical normalization data, generated into unicode_tables.cpp by scripts/gen_unicode_tables.py.
// Every table is sorted by its first field(s) for binary search.
#include <cstddef>
#include <cstdint>

namespace di::recipe::unicode_tables {

struct CccEntry {
  char32_t cp;
  uint8_t ccc;  // canonical combining class, never 0 here
};
struct DecompEntry {
  char32_t cp;
  uint16_t offset;  // into kDecompPool: the full (recursive) canonical decomposition
  uint8_t length;
};
struct CompEntry {
  char32_t first, second, composite;  // primary composites only (exclusions removed)
};
struct CodepointRange {
  char32_t lo, hi;  // inclusive
};

extern const CccEntry kCcc[];
extern const size_t kNumCcc;
extern const char32_t kDecompPool[];
extern const DecompEntry kDecomp[];
extern const size_t kNumDecomp;
extern const CompEntry kComp[];
extern const size_t kNumComp;
// Code points before which NFC may change the text: ccc != 0, NFC_QC = No, or the second half of a
// composition (NFC_QC = Maybe). Any other code point starts an independent normalization segment.
extern const CodepointRange kNfcUnsafe[];
extern const size_t kNumNfcUnsafe;

}  // namespace di::recipe::unicode_tables
