#include "recipe/bpe.h"

#include <atomic>
#include <cstring>
#include <algorithm>

#include <nlohmann/json.hpp>

#include "recipe/byte_level.h"

namespace di::recipe {
namespace {

uint64_t mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDull;
  h ^= h >> 33;
  return h;
}

uint64_t hash_bytes(std::string_view s) {
  const char* p = s.data();
  size_t n = s.size();
  uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    h = (h ^ v) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  uint64_t v = 0;
  std::memcpy(&v, p, n);
  return mix(h ^ v);
}

size_t table_capacity(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;  // load factor <= 0.5
  return cap;
}

// Recently encoded pieces of one thread, for one model at a time. Typical text repeats a small set of
// words, so most pieces skip the merge loop.
struct PieceCache {
  static constexpr size_t kMaxEntries = 1 << 16;
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return hash_bytes(s); }
  };
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<TokenId>, Hash, std::equal_to<>> map;
};

std::atomic<uint64_t> g_next_instance{1};

}  // namespace

void BpeModel::PairTable::init(size_t n) {
  size_t cap = table_capacity(n);
  keys.assign(cap, kEmpty);
  values.assign(cap, Merge{0, -1});
  mask = cap - 1;
}

void BpeModel::PairTable::insert(uint64_t key, Merge m) {
  for (uint64_t i = mix(key) & mask;; i = (i + 1) & mask) {
    if (keys[i] == kEmpty) {
      keys[i] = key;
      values[i] = m;
      return;
    }
    if (keys[i] == key) return;  // a duplicate merge keeps its first (lowest) rank
  }
}

const BpeModel::Merge* BpeModel::PairTable::find(uint64_t key) const {
  for (uint64_t i = mix(key) & mask;; i = (i + 1) & mask) {
    if (keys[i] == key) return &values[i];
    if (keys[i] == kEmpty) return nullptr;
  }
}

void BpeModel::BytesTable::init(size_t n) {
  size_t cap = table_capacity(n);
  slots.assign(cap, -1);
  mask = cap - 1;
}

Result<BpeModel> BpeModel::from_json(const nlohmann::json& node) {
  using nlohmann::json;
  auto invalid = [](std::string msg) { return Status(StatusCode::kInvalidArgument, std::move(msg)); };
  try {
    if (node.value("type", "BPE") != "BPE") {
      return invalid(fmt::format("unsupported model type {:?} (only BPE)", node.value("type", "")));
    }
    if (node.contains("byte_fallback") && node.at("byte_fallback").is_boolean() && node.at("byte_fallback").get<bool>()) {
      return invalid("BPE byte_fallback is not supported (byte-level BPE only)");
    }
    if (node.contains("dropout") && !node.at("dropout").is_null()) return invalid("BPE dropout is not supported");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (node.contains(key) && !node.at(key).is_null() && !node.at(key).get<std::string>().empty()) {
        return invalid(fmt::format("BPE {} is not supported", key));
      }
    }
    BpeModel m;
    m.instance_ = g_next_instance.fetch_add(1);
    m.ignore_merges_ = node.value("ignore_merges", false);
    const json& vocab = node.at("vocab");
    TokenId max_id = -1;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) max_id = std::max(max_id, it.value().get<TokenId>());
    m.tokens_.resize(max_id + 1);
    m.bytes_.resize(max_id + 1);
    m.by_token_.reserve(vocab.size());
    m.by_bytes_.init(vocab.size());
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      TokenId id = it.value().get<TokenId>();
      if (id < 0) return invalid(fmt::format("negative id {} in vocab", id));
      m.tokens_[id] = it.key();
      m.by_token_.emplace(it.key(), id);
      auto bytes = byte_level::token_to_bytes(it.key());
      m.bytes_[id] = bytes ? *bytes : it.key();
      if (!bytes) continue;  // not reachable by merges (e.g. "<｜begin▁of▁sentence｜>")
      for (uint64_t i = hash_bytes(*bytes) & m.by_bytes_.mask;; i = (i + 1) & m.by_bytes_.mask) {
        TokenId& slot = m.by_bytes_.slots[i];
        if (slot < 0) {
          slot = id;
          break;
        }
        if (m.bytes_[slot] == *bytes) break;
      }
    }
    for (int b = 0; b < 256; ++b) {
      auto id = m.id_of_bytes(std::string_view(reinterpret_cast<const char*>(&b), 1));
      if (!id) return invalid(fmt::format("vocab lacks the byte-level token for byte 0x{:02X}", b));
      m.byte_ids_[b] = *id;
    }
    const json& merges = node.at("merges");
    m.merges_.init(merges.size());
    for (size_t rank = 0; rank < merges.size(); ++rank) {
      const json& merge = merges[rank];
      std::string a, b;
      if (merge.is_string()) {
        const std::string& s = merge.get_ref<const std::string&>();
        size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
          return invalid(fmt::format("merge {} {:?} is not two tokens separated by one space", rank, s));
        }
        a = s.substr(0, space);
        b = s.substr(space + 1);
      } else {
        if (!merge.is_array() || merge.size() != 2) return invalid(fmt::format("merge {} is not a pair", rank));
        a = merge[0].get<std::string>();
        b = merge[1].get<std::string>();
      }
      auto ia = m.id_of_token(a), ib = m.id_of_token(b), ic = m.id_of_token(a + b);
      if (!ia || !ib || !ic) {
        return invalid(fmt::format("merge {} ({:?}, {:?}) uses a token outside the vocab", rank, a, b));
      }
      m.merges_.insert((uint64_t(uint32_t(*ia)) << 32) | uint32_t(*ib), Merge{static_cast<uint32_t>(rank), *ic});
    }
    return m;
  } catch (const json::exception& e) {
    return invalid(fmt::format("bad BPE model: {}", e.what()));
  }
}

std::optional<TokenId> BpeModel::id_of_bytes(std::string_view bytes) const {
  for (uint64_t i = hash_bytes(bytes) & by_bytes_.mask;; i = (i + 1) & by_bytes_.mask) {
    TokenId id = by_bytes_.slots[i];
    if (id < 0) return std::nullopt;
    if (bytes_[id] == bytes) return id;
  }
}

std::optional<TokenId> BpeModel::id_of_token(std::string_view token) const {
  auto it = by_token_.find(token);
  if (it == by_token_.end()) return std::nullopt;
  return it->second;
}

const std::string& BpeModel::token(TokenId id) const {
  static const std::string kEmpty;
  return id >= 0 && id < static_cast<TokenId>(tokens_.size()) ? tokens_[id] : kEmpty;
}

const std::string& BpeModel::bytes(TokenId id) const {
  static const std::string kEmpty;
  return id >= 0 && id < static_cast<TokenId>(bytes_.size()) ? bytes_[id] : kEmpty;
}

void BpeModel::encode_piece(std::string_view piece, std::vector<TokenId>& out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    if (auto id = id_of_bytes(piece)) {
      out.push_back(*id);
      return;
    }
  }
  if (piece.size() == 1) {
    out.push_back(byte_ids_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  if (piece.size() > kMaxCachedPiece) {
    merge_heap(piece, out);
    return;
  }
  thread_local PieceCache cache;
  if (cache.owner != instance_) {
    cache.map.clear();
    cache.owner = instance_;
  }
  if (auto it = cache.map.find(piece); it != cache.map.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  size_t first = out.size();
  merge_piece(piece, out);
  if (cache.map.size() >= PieceCache::kMaxEntries) cache.map.clear();
  cache.map.emplace(std::string(piece), std::vector<TokenId>(out.begin() + first, out.end()));
}

void BpeModel::merge_piece(std::string_view piece, std::vector<TokenId>& out, bool force_heap) const {
  if (piece.empty()) return;
  if (force_heap || piece.size() > kSmallWord) {
    merge_heap(piece, out);
  } else {
    merge_small(piece, out);
  }
}

void BpeModel::merge_small(std::string_view piece, std::vector<TokenId>& out) const {
  constexpr uint32_t kNone = ~uint32_t{0};
  size_t n = piece.size();
  TokenId ids[kSmallWord];
  uint32_t ranks[kSmallWord];  // ranks[i]: the merge of (ids[i], ids[i + 1]), kNone if none
  TokenId merged[kSmallWord];
  for (size_t i = 0; i < n; ++i) ids[i] = byte_ids_[static_cast<uint8_t>(piece[i])];
  auto rate = [&](size_t i) {
    const Merge* m = find_merge(ids[i], ids[i + 1]);
    ranks[i] = m ? m->rank : kNone;
    merged[i] = m ? m->id : -1;
  };
  for (size_t i = 0; i + 1 < n; ++i) rate(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i) {
      if (ranks[i] < ranks[best]) best = i;
    }
    if (ranks[best] == kNone) break;
    ids[best] = merged[best];
    size_t tail = n - best - 2;  // symbols after best + 1
    std::memmove(ids + best + 1, ids + best + 2, tail * sizeof(TokenId));
    std::memmove(ranks + best + 1, ranks + best + 2, tail * sizeof(uint32_t));
    std::memmove(merged + best + 1, merged + best + 2, tail * sizeof(TokenId));
    --n;
    if (best > 0) rate(best - 1);
    if (best + 1 < n) rate(best);
  }
  out.insert(out.end(), ids, ids + n);
}

void BpeModel::merge_heap(std::string_view piece, std::vector<TokenId>& out) const {
  struct Symbol {
    TokenId id;
    int32_t prev, next;  // -1 at the ends; a merged-away symbol has id -1
  };
  struct Candidate {
    uint32_t rank;
    int32_t pos;  // the left symbol
    TokenId merged;
  };
  // Min-heap on (rank, pos): the lowest rank first, the leftmost among equals.
  auto later = [](const Candidate& a, const Candidate& b) { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; };
  // Per-thread scratch: long pieces are common in CJK text (DeepSeek keeps a whole run of Han/kana as
  // one piece), and two allocations per piece cost as much as the merges.
  thread_local std::vector<Symbol> syms;
  thread_local std::vector<Candidate> heap;
  const int32_t n = static_cast<int32_t>(piece.size());
  syms.resize(n);
  heap.clear();
  for (int32_t i = 0; i < n; ++i) syms[i] = {byte_ids_[static_cast<uint8_t>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1};
  auto push = [&](int32_t left) {
    if (left < 0 || syms[left].next < 0) return;
    if (const Merge* m = find_merge(syms[left].id, syms[syms[left].next].id)) {
      heap.push_back({m->rank, left, m->id});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) {
    if (const Merge* m = find_merge(syms[i].id, syms[i + 1].id)) heap.push_back({m->rank, i, m->id});
  }
  std::make_heap(heap.begin(), heap.end(), later);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate c = heap.back();
    heap.pop_back();
    Symbol& left = syms[c.pos];
    if (left.id < 0 || left.next < 0) continue;
    // Stale if either side changed since the candidate was pushed (HF compares the merged id).
    const Merge* m = find_merge(left.id, syms[left.next].id);
    if (m == nullptr || m->id != c.merged) continue;
    Symbol& right = syms[left.next];
    left.id = c.merged;
    right.id = -1;
    left.next = right.next;
    if (right.next >= 0) syms[right.next].prev = c.pos;
    push(left.prev);
    push(c.pos);
  }
  for (int32_t i = 0; i >= 0 && i < n; i = syms[i].next) out.push_back(syms[i].id);
}

}  // namespace di::recipe
