#include "recipe/unicode.h"

#include <algorithm>
#include <vector>

#include "recipe/unicode_tables.h"

namespace di::recipe::unicode {
namespace {

namespace t = unicode_tables;

constexpr char32_t kHangulS = 0xAC00, kHangulL = 0x1100, kHangulV = 0x1161, kHangulT = 0x11A7;
constexpr int kHangulLCount = 19, kHangulVCount = 21, kHangulTCount = 28;
constexpr int kHangulNCount = kHangulVCount * kHangulTCount, kHangulSCount = kHangulLCount * kHangulNCount;

uint8_t ccc(char32_t cp) {
  if (cp < 0x300) return 0;
  auto it = std::lower_bound(t::kCcc, t::kCcc + t::kNumCcc, cp,
                             [](const t::CccEntry& e, char32_t c) { return e.cp < c; });
  return it != t::kCcc + t::kNumCcc && it->cp == cp ? it->ccc : 0;
}

bool is_nfc_unsafe(char32_t cp) {
  if (cp < 0x300) return false;
  auto it = std::upper_bound(t::kNfcUnsafe, t::kNfcUnsafe + t::kNumNfcUnsafe, cp,
                             [](char32_t c, const t::CodepointRange& r) { return c < r.lo; });
  return it != t::kNfcUnsafe && cp <= (it - 1)->hi;
}

void decompose(char32_t cp, std::vector<char32_t>& out) {
  if (cp >= kHangulS && cp < kHangulS + kHangulSCount) {
    int s = static_cast<int>(cp - kHangulS);
    out.push_back(kHangulL + s / kHangulNCount);
    out.push_back(kHangulV + (s % kHangulNCount) / kHangulTCount);
    if (s % kHangulTCount != 0) out.push_back(kHangulT + s % kHangulTCount);
    return;
  }
  auto it = std::lower_bound(t::kDecomp, t::kDecomp + t::kNumDecomp, cp,
                             [](const t::DecompEntry& e, char32_t c) { return e.cp < c; });
  if (it != t::kDecomp + t::kNumDecomp && it->cp == cp) {
    out.insert(out.end(), t::kDecompPool + it->offset, t::kDecompPool + it->offset + it->length);
  } else {
    out.push_back(cp);
  }
}

// 0 when the pair does not compose.
char32_t compose_pair(char32_t a, char32_t b) {
  if (a >= kHangulL && a < kHangulL + kHangulLCount && b >= kHangulV && b < kHangulV + kHangulVCount) {
    return kHangulS + ((a - kHangulL) * kHangulVCount + (b - kHangulV)) * kHangulTCount;
  }
  if (a >= kHangulS && a < kHangulS + kHangulSCount && (a - kHangulS) % kHangulTCount == 0 &&
      b > kHangulT && b < kHangulT + kHangulTCount) {
    return a + (b - kHangulT);
  }
  auto less = [](const t::CompEntry& e, std::pair<char32_t, char32_t> k) {
    return e.first < k.first || (e.first == k.first && e.second < k.second);
  };
  auto it = std::lower_bound(t::kComp, t::kComp + t::kNumComp, std::pair{a, b}, less);
  return it != t::kComp + t::kNumComp && it->first == a && it->second == b ? it->composite : 0;
}

// Decomposes [s, s+n) into `cps` in canonical order.
void decompose_ordered(std::string_view s, std::vector<char32_t>& cps) {
  cps.clear();
  for (size_t i = 0; i < s.size();) {
    char32_t cp = 0;
    size_t len = decode_one(s.data() + i, s.size() - i, &cp);
    if (len == 0) {
      cp = kReplacement;
      len = 1;
    }
    decompose(cp, cps);
    i += len;
  }
  // Canonical ordering: a stable sort of each run of non-starters by combining class.
  for (size_t i = 1; i < cps.size(); ++i) {
    uint8_t c = ccc(cps[i]);
    if (c == 0) continue;
    for (size_t j = i; j > 0; --j) {
      uint8_t p = ccc(cps[j - 1]);
      if (p <= c) break;
      std::swap(cps[j - 1], cps[j]);
    }
  }
}

void compose(std::vector<char32_t>& cps) {
  if (cps.empty()) return;
  size_t out = 0;
  ptrdiff_t starter = -1;  // index in the output of the last starter
  int last_cc = -1;        // class of the last char kept after the starter; -1: none (adjacent)
  for (size_t i = 0; i < cps.size(); ++i) {
    char32_t cp = cps[i];
    int cc = ccc(cp);
    if (starter >= 0 && (last_cc == -1 || (last_cc != 0 && last_cc < cc))) {
      if (char32_t c = compose_pair(cps[starter], cp)) {
        cps[starter] = c;
        continue;
      }
    }
    if (cc == 0) {
      starter = static_cast<ptrdiff_t>(out);
      last_cc = -1;
    } else {
      last_cc = cc;
    }
    cps[out++] = cp;
  }
  cps.resize(out);
}

}  // namespace

size_t decode_one(const char* s, size_t n, char32_t* cp) {
  auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  if (n == 0) return 0;
  unsigned char c0 = b(0);
  if (c0 < 0x80) {
    *cp = c0;
    return 1;
  }
  if (c0 < 0xC2) return 0;
  if (c0 < 0xE0) {
    if (n < 2 || (b(1) & 0xC0) != 0x80) return 0;
    *cp = (char32_t(c0 & 0x1F) << 6) | (b(1) & 0x3F);
    return 2;
  }
  if (c0 < 0xF0) {
    if (n < 3) return 0;
    unsigned char c1 = b(1);
    unsigned char lo = c0 == 0xE0 ? 0xA0 : 0x80, hi = c0 == 0xED ? 0x9F : 0xBF;
    if (c1 < lo || c1 > hi || (b(2) & 0xC0) != 0x80) return 0;
    *cp = (char32_t(c0 & 0x0F) << 12) | (char32_t(c1 & 0x3F) << 6) | (b(2) & 0x3F);
    return 3;
  }
  if (c0 < 0xF5) {
    if (n < 4) return 0;
    unsigned char c1 = b(1);
    unsigned char lo = c0 == 0xF0 ? 0x90 : 0x80, hi = c0 == 0xF4 ? 0x8F : 0xBF;
    if (c1 < lo || c1 > hi || (b(2) & 0xC0) != 0x80 || (b(3) & 0xC0) != 0x80) return 0;
    *cp = (char32_t(c0 & 0x07) << 18) | (char32_t(c1 & 0x3F) << 12) | (char32_t(b(2) & 0x3F) << 6) |
          (b(3) & 0x3F);
    return 4;
  }
  return 0;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t valid_prefix_length(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    char32_t cp = 0;
    size_t len = decode_one(s.data() + i, s.size() - i, &cp);
    if (len == 0) return i;
    i += len;
  }
  return i;
}

// Length of the maximal prefix of s[0..n) that starts a well-formed sequence (1 for a bad lead byte).
static size_t maximal_subpart(const char* s, size_t n) {
  auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  unsigned char c0 = b(0);
  size_t need = c0 >= 0xC2 && c0 < 0xE0 ? 2 : c0 >= 0xE0 && c0 < 0xF0 ? 3 : c0 >= 0xF0 && c0 < 0xF5 ? 4 : 0;
  if (need == 0) return 1;
  size_t i = 1;
  for (; i < need && i < n; ++i) {
    unsigned char lo = 0x80, hi = 0xBF;
    if (i == 1) {
      if (c0 == 0xE0) lo = 0xA0;
      if (c0 == 0xED) hi = 0x9F;
      if (c0 == 0xF0) lo = 0x90;
      if (c0 == 0xF4) hi = 0x8F;
    }
    if (b(i) < lo || b(i) > hi) break;
  }
  return i;
}

size_t incomplete_tail_length(std::string_view s) {
  // A character is at most 4 bytes: look for the last lead byte within the final 3 bytes.
  size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    if (c < 0xC2 || c >= 0xF5) return 0;
    size_t need = c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (back >= need) return 0;  // complete (or ill-formed) sequence, not waiting for bytes
    return maximal_subpart(s.data() + n - back, back) == back ? back : 0;
  }
  return 0;
}

std::string repair(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t good = valid_prefix_length(s.substr(i));
    out.append(s.substr(i, good));
    i += good;
    if (i == s.size()) break;
    append_utf8(out, kReplacement);
    i += maximal_subpart(s.data() + i, s.size() - i);
  }
  return out;
}

bool is_nfc_quick(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    // Code points below U+0300 (lead bytes below 0xCC) never change under NFC.
    if (static_cast<unsigned char>(s[i]) < 0xCC) {
      ++i;
      continue;
    }
    char32_t cp = 0;
    size_t len = decode_one(s.data() + i, s.size() - i, &cp);
    if (len == 0) return false;
    if (is_nfc_unsafe(cp)) return false;
    i += len;
  }
  return true;
}

std::string nfc(std::string_view s) {
  if (is_nfc_quick(s)) return std::string(s);
  std::string out;
  out.reserve(s.size() + 8);
  std::vector<char32_t> cps;
  // Split into segments that each start at a code point that is NFC-safe (ccc 0, NFC_QC Yes): NFC of
  // the concatenation is the concatenation of the NFC of the segments.
  size_t seg_begin = 0;
  auto flush = [&](size_t end) {
    std::string_view seg = s.substr(seg_begin, end - seg_begin);
    if (is_nfc_quick(seg)) {
      out.append(seg);
    } else {
      decompose_ordered(seg, cps);
      compose(cps);
      for (char32_t cp : cps) append_utf8(out, cp);
    }
    seg_begin = end;
  };
  for (size_t i = 0; i < s.size();) {
    char32_t cp = 0;
    size_t len = decode_one(s.data() + i, s.size() - i, &cp);
    if (len == 0) {
      cp = kReplacement;
      len = 1;
    }
    if (i > seg_begin && !is_nfc_unsafe(cp)) flush(i);
    i += len;
  }
  flush(s.size());
  return out;
}

std::string nfd(std::string_view s) {
  std::vector<char32_t> cps;
  decompose_ordered(s, cps);
  std::string out;
  out.reserve(s.size());
  for (char32_t cp : cps) append_utf8(out, cp);
  return out;
}

bool is_whitespace(char32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

}  // namespace di::recipe::unicode
