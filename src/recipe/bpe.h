#pragma once
// The byte-level BPE model: vocabulary, merge ranks, and the merge loop for one pre-tokenized piece.
//
// Works on raw bytes: vocabulary strings are converted from the GPT-2 byte alphabet at load, so a
// piece is encoded without re-spelling it. Merges are applied lowest rank first, leftmost first
// (what HF `tokenizers` does with its priority queue). Pieces up to kSmallWord bytes use a simple
// O(n^2) scan over a stack array; longer ones (CJK runs, whitespace runs) use a heap, which is
// faster from ~24 bytes on (measured on DeepSeek CJK: 17 vs 25 ns/byte at 48 bytes, 18 vs 55 at 96).
// Pieces up to kMaxCachedPiece bytes go through a per-thread cache (HF caches words < 256 chars).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace di::recipe {

using TokenId = int32_t;

class BpeModel {
 public:
  static constexpr size_t kSmallWord = 24;
  static constexpr size_t kMaxCachedPiece = 256;

  // `node` is tokenizer.json's "model" (type BPE).
  static Result<BpeModel> from_json(const nlohmann::json& node);

  // Appends the ids of one piece (raw bytes). Uses a per-thread cache of recent pieces.
  void encode_piece(std::string_view piece, std::vector<TokenId>& out) const;
  // The merge loop alone, without the cache and the ignore_merges shortcut; `force_heap` selects the
  // long-word algorithm for any length (tests check both give the same ids).
  void merge_piece(std::string_view piece, std::vector<TokenId>& out, bool force_heap = false) const;

  std::optional<TokenId> id_of_bytes(std::string_view bytes) const;
  // Vocabulary spelling (byte-level alphabet), "" for ids outside the vocabulary.
  const std::string& token(TokenId id) const;
  // The bytes an id decodes to (the ByteLevel decoder's rule; raw UTF-8 for non-alphabet spellings).
  const std::string& bytes(TokenId id) const;
  std::optional<TokenId> id_of_token(std::string_view token) const;
  int32_t max_id() const { return static_cast<int32_t>(tokens_.size()) - 1; }

 private:
  struct Merge {
    uint32_t rank;
    TokenId id;
  };
  // Open-addressing table (id_a, id_b) -> Merge.
  struct PairTable {
    std::vector<uint64_t> keys;  // kEmpty where free
    std::vector<Merge> values;
    uint64_t mask = 0;
    static constexpr uint64_t kEmpty = ~uint64_t{0};
    void init(size_t n);
    void insert(uint64_t key, Merge m);
    const Merge* find(uint64_t key) const;
  };
  // Open-addressing table bytes -> id, comparing against bytes_[id].
  struct BytesTable {
    std::vector<TokenId> slots;  // -1 where free
    uint64_t mask = 0;
    void init(size_t n);
  };

  const Merge* find_merge(TokenId a, TokenId b) const {
    return merges_.find((uint64_t(uint32_t(a)) << 32) | uint32_t(b));
  }
  void merge_small(std::string_view piece, std::vector<TokenId>& out) const;
  void merge_heap(std::string_view piece, std::vector<TokenId>& out) const;

  std::vector<std::string> tokens_;  // id -> vocabulary spelling
  std::vector<std::string> bytes_;   // id -> decoded bytes
  BytesTable by_bytes_;
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, TokenId, StringHash, std::equal_to<>> by_token_;
  PairTable merges_;
  TokenId byte_ids_[256];
  bool ignore_merges_ = false;
  uint64_t instance_ = 0;  // distinguishes models in the per-thread cache
};

}  // namespace di::recipe
