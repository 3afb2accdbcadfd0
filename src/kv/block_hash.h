#pragma once
// Prefix identity of a full KV block (design.md §3): a SHA-256 chain over full blocks.
//
//   h_0 = SHA-256(              u32(|salt|) ‖ salt ‖ u32(|model_id|) ‖ model_id ‖ tokens_0)
//   h_i = SHA-256(h_{i-1}     ‖                       u32(|model_id|) ‖ model_id ‖ tokens_i)
//
// u32 values and token ids are little-endian u32; tokens_i are the block_size token ids of block i.
// The length prefixes make the byte string injective (salt "ab" + model "c" differs from salt "a" +
// model "bc"). Only full blocks have a hash; a partial last block has none and is never shared.
// The router and every storage tier name blocks by these hashes, so this layout is a wire format.
#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/ids.h"

namespace di {

struct BlockHash {
  std::array<uint8_t, 32> bytes{};
  auto operator<=>(const BlockHash&) const = default;
  std::string hex() const;
};

// Hash of one full block; `parent` is null for block 0, which is the only block that mixes the
// salt.
BlockHash hash_block(const BlockHash* parent, std::string_view cache_salt,
                     std::string_view model_id, std::span<const TokenId> block_tokens);

// Appends to `hashes` the hashes of the full blocks of `tokens` that `hashes` does not cover yet
// (hashes[i] must already be the hash of block i for i < hashes.size()).
void extend_block_hashes(std::vector<BlockHash>& hashes, std::span<const TokenId> tokens,
                         int32_t block_size, std::string_view model_id,
                         std::string_view cache_salt);

}  // namespace di

template <>
struct std::hash<di::BlockHash> {
  size_t operator()(const di::BlockHash& h) const noexcept {
    size_t v;  // SHA-256 output is uniform: any 8 bytes make a good bucket hash
    std::memcpy(&v, h.bytes.data(), sizeof(v));
    return v;
  }
};
