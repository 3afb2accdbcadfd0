#include "kv/block_hash.h"

#include <openssl/sha.h>

#include "core/error.h"

namespace di {
namespace {

void put_u32_le(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

void put_string(std::vector<uint8_t>& out, std::string_view s) {
  DI_CHECK(s.size() <= UINT32_MAX, "string of {} bytes is too long to hash", s.size());
  put_u32_le(out, static_cast<uint32_t>(s.size()));
  out.insert(out.end(), s.begin(), s.end());
}

}  // namespace

std::string BlockHash::hex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  s.reserve(64);
  for (uint8_t b : bytes) {
    s.push_back(kDigits[b >> 4]);
    s.push_back(kDigits[b & 15]);
  }
  return s;
}

BlockHash hash_block(const BlockHash* parent, std::string_view cache_salt,
                     std::string_view model_id, std::span<const TokenId> block_tokens) {
  // 32 + 4 + |model_id| + 4 x 64 tokens: ~300 bytes, about 1 us of SHA-256 per block.
  thread_local std::vector<uint8_t> buf;
  buf.clear();
  if (parent != nullptr) {
    buf.insert(buf.end(), parent->bytes.begin(), parent->bytes.end());
  } else {
    put_string(buf, cache_salt);
  }
  put_string(buf, model_id);
  for (TokenId t : block_tokens) {
    DI_CHECK(t >= 0, "token id {} is negative", t);
    put_u32_le(buf, static_cast<uint32_t>(t));
  }
  BlockHash h;
  SHA256(buf.data(), buf.size(), h.bytes.data());
  return h;
}

void extend_block_hashes(std::vector<BlockHash>& hashes, std::span<const TokenId> tokens,
                         int32_t block_size, std::string_view model_id,
                         std::string_view cache_salt) {
  DI_CHECK(block_size > 0, "block_size must be positive, got {}", block_size);
  size_t num_full = tokens.size() / static_cast<size_t>(block_size);
  DI_CHECK(hashes.size() <= num_full, "{} hashes for {} full blocks", hashes.size(), num_full);
  hashes.reserve(num_full);
  for (size_t i = hashes.size(); i < num_full; ++i) {
    const BlockHash* parent = i == 0 ? nullptr : &hashes[i - 1];
    hashes.push_back(hash_block(parent, cache_salt, model_id,
                                tokens.subspan(i * block_size, static_cast<size_t>(block_size))));
  }
}

}  // namespace di
