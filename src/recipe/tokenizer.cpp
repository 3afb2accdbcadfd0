// The tokenizer pipeline, as HF `tokenizers` runs it for byte-level BPE files:
//
//   text ─► added tokens (raw) ─► normalizer ─► added tokens (normalized) ─► pre-tokenizer ─► BPE
//   ─► ids
//            special mode only                   special mode only            regex splits      per
//            piece
//
// encode_ordinary skips both added-token steps, so text spelling a control token yields the ids of
// its characters. decode is the ByteLevel decoder: each id's bytes, concatenated.
#include "recipe/tokenizer.h"

#include <algorithm>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/thread_pool.h"
#include "recipe/added_vocabulary.h"
#include "recipe/bpe.h"
#include "recipe/byte_level.h"
#include "recipe/normalizer.h"
#include "recipe/pretokenizer.h"
#include "recipe/unicode.h"

namespace di::recipe {
namespace {

// Below this size the parallel encoder runs serially: thread hand-off costs ~10 us, and 64 KiB
// encodes in ~2-3 ms on one core.
constexpr size_t kParallelMinBytes = 64 * 1024;

// The global pool's parallel_for serves one caller at a time; a second concurrent caller encodes
// serially instead of waiting.
std::mutex g_pool_mutex;

// The ids, pieces and pre-tokenizer shared by a tokenizer and its control-token variants.
struct Core {
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  BpeModel model;
};

class ByteLevelBpeTokenizer final : public Tokenizer {
 public:
  ByteLevelBpeTokenizer(std::shared_ptr<const Core> core, std::vector<AddedToken> added)
      : core_(std::move(core)), added_(std::move(added)) {
    build_added();
  }
  // The matchers point into added_.
  ByteLevelBpeTokenizer(const ByteLevelBpeTokenizer&) = delete;
  ByteLevelBpeTokenizer& operator=(const ByteLevelBpeTokenizer&) = delete;

  std::vector<TokenId> encode_ordinary(std::string_view text) const override {
    std::string repaired, normalized;
    std::string_view t = prepare(text, repaired, normalized);
    std::vector<TokenId> ids;
    ids.reserve(t.size() / 3 + 8);
    encode_plain(t, ids);
    return ids;
  }

  std::vector<TokenId> encode_with_special(std::string_view text) const override {
    std::string repaired;
    std::string_view t = text;
    if (!unicode::is_valid(t)) t = repaired = unicode::repair(t);
    std::vector<TokenId> ids;
    ids.reserve(t.size() / 3 + 8);
    std::vector<AddedTokenMatcher::Match> matches;
    raw_matcher_.find_all(t, matches);
    size_t pos = 0;
    for (const auto& m : matches) {
      encode_between_raw_matches(t.substr(pos, m.begin - pos), ids);
      ids.push_back(m.id);
      pos = m.end;
    }
    encode_between_raw_matches(t.substr(pos), ids);
    return ids;
  }

  std::vector<TokenId> encode_ordinary_parallel(std::string_view text) const override {
    ThreadPool& pool = ThreadPool::global();
    if (text.size() < kParallelMinBytes || pool.num_threads() < 2) return encode_ordinary(text);
    return encode_ordinary_parallel(text, pool.num_threads());
  }
  std::vector<TokenId> encode_ordinary_parallel(std::string_view text,
                                                int num_chunks) const override;

  std::string decode(const std::vector<TokenId>& ids, bool skip_special) const override {
    std::string out;
    for (TokenId id : ids) {
      if (skip_special && is_special(id)) continue;
      out.append(token_bytes(id));
    }
    return out;
  }

  std::string_view token_bytes(TokenId id) const override {
    if (auto it = added_index_.find(id); it != added_index_.end()) return added_bytes_[it->second];
    return core_->model.bytes(id);
  }

  std::string id_to_token(TokenId id) const override {
    if (auto it = added_index_.find(id); it != added_index_.end())
      return added_[it->second].content;
    return core_->model.token(id);
  }

  std::optional<TokenId> token_to_id(std::string_view token) const override {
    if (auto it = added_by_content_.find(token); it != added_by_content_.end()) return it->second;
    return core_->model.id_of_token(token);
  }

  bool is_special(TokenId id) const override {
    auto it = added_index_.find(id);
    return it != added_index_.end() && added_[it->second].special;
  }

  const std::vector<AddedToken>& added_tokens() const override { return added_; }

  int32_t vocab_size() const override {
    int32_t max_id = core_->model.max_id();
    for (const AddedToken& t : added_) max_id = std::max(max_id, t.id);
    return max_id + 1;
  }

  Result<std::shared_ptr<const Tokenizer>> with_added_tokens(
      std::vector<AddedToken> tokens) const override {
    std::vector<AddedToken> added = added_;
    int32_t next_id = vocab_size();
    for (AddedToken& t : tokens) {
      if (t.content.empty())
        return Status(StatusCode::kInvalidArgument, "an added token cannot be empty");
      auto existing = std::find_if(added.begin(), added.end(),
                                   [&](const AddedToken& a) { return a.content == t.content; });
      if (existing != added.end()) continue;
      if (auto vocab_id = core_->model.id_of_token(t.content)) {
        t.id = *vocab_id;
      } else if (t.id < 0) {
        t.id = next_id++;
      } else if (added_index_.count(t.id) ||
                 (t.id <= core_->model.max_id() && !core_->model.token(t.id).empty())) {
        return make_status(StatusCode::kAlreadyExists, "id {} of added token {:?} is taken", t.id,
                           t.content);
      } else {
        next_id = std::max(next_id, t.id + 1);
      }
      added.push_back(std::move(t));
    }
    return std::shared_ptr<const Tokenizer>(
        std::make_shared<ByteLevelBpeTokenizer>(core_, std::move(added)));
  }

 private:
  void build_added() {
    std::vector<const AddedToken*> raw, normalized;
    std::vector<std::string> raw_contents, normalized_contents;
    added_bytes_.clear();
    for (size_t i = 0; i < added_.size(); ++i) {
      const AddedToken& t = added_[i];
      added_index_[t.id] = i;
      added_by_content_.emplace(t.content, t.id);
      // ByteLevel decoder: alphabet spellings map back to bytes, anything else is emitted as is.
      auto bytes = byte_level::token_to_bytes(t.content);
      added_bytes_.push_back(bytes ? *bytes : t.content);
      if (t.normalized && !core_->normalizer.is_identity()) {
        normalized.push_back(&t);
        normalized_contents.push_back(core_->normalizer.apply(t.content));
      } else if (t.normalized) {
        normalized.push_back(&t);
        normalized_contents.push_back(t.content);
      } else {
        raw.push_back(&t);
        raw_contents.push_back(t.content);
      }
    }
    raw_matcher_ = AddedTokenMatcher(raw, raw_contents);
    normalized_matcher_ = AddedTokenMatcher(normalized, normalized_contents);
  }

  // Valid UTF-8, normalized: what the pre-tokenizer sees in ordinary mode.
  std::string_view prepare(std::string_view text, std::string& repaired,
                           std::string& normalized) const {
    std::string_view t = text;
    if (!unicode::is_valid(t)) t = repaired = unicode::repair(t);
    if (!core_->normalizer.is_identity()) t = normalized = core_->normalizer.apply(t);
    return t;
  }

  void encode_between_raw_matches(std::string_view segment, std::vector<TokenId>& ids) const {
    if (segment.empty()) return;
    std::string normalized;
    std::string_view t = segment;
    if (!core_->normalizer.is_identity()) t = normalized = core_->normalizer.apply(segment);
    if (normalized_matcher_.empty()) {
      encode_plain(t, ids);
      return;
    }
    std::vector<AddedTokenMatcher::Match> matches;
    normalized_matcher_.find_all(t, matches);
    size_t pos = 0;
    for (const auto& m : matches) {
      encode_plain(t.substr(pos, m.begin - pos), ids);
      ids.push_back(m.id);
      pos = m.end;
    }
    encode_plain(t.substr(pos), ids);
  }

  // Pre-tokenizer + BPE on normalized text.
  void encode_plain(std::string_view t, std::vector<TokenId>& ids) const {
    if (t.empty()) return;
    std::string storage;
    std::vector<Span> spans;
    std::string_view view = core_->pre_tokenizer.split(t, storage, spans);
    for (const Span& s : spans)
      core_->model.encode_piece(view.substr(s.begin, s.end - s.begin), ids);
  }

  std::shared_ptr<const Core> core_;
  std::vector<AddedToken> added_;
  std::vector<std::string> added_bytes_;
  std::unordered_map<TokenId, size_t> added_index_;
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, TokenId, StringHash, std::equal_to<>> added_by_content_;
  AddedTokenMatcher raw_matcher_, normalized_matcher_;
};

// Parallel ordinary encoding. Only the first pre-tokenizer stage looks across piece boundaries, so:
//   A (parallel) each chunk scans the first stage's regex from its cut over the whole text;
//   B (serial)   the chunk scans are stitched into exactly the serial scan: where the previous
//                chunk's scan stands inside this chunk's scan at a match start, a match end or
//                inside a gap, the two agree from there on (the regex sees the same subject);
//                inside a match the serial scan steps on until they agree;
//   C (parallel) contiguous groups of first-stage pieces run the later stages and BPE.
// The ids equal encode_ordinary's for any cut positions; cuts only affect speed.
std::vector<TokenId> ByteLevelBpeTokenizer::encode_ordinary_parallel(std::string_view text,
                                                                     int num_chunks) const {
  DI_CHECK(num_chunks >= 1, "num_chunks must be positive, got {}", num_chunks);
  ThreadPool& pool = ThreadPool::global();
  const PreTokenizer& pre = core_->pre_tokenizer;
  if (num_chunks == 1 || !pre.can_split_in_parallel()) return encode_ordinary(text);
  std::unique_lock lock(g_pool_mutex, std::try_to_lock);
  if (!lock.owns_lock()) return encode_ordinary(text);

  std::string repaired, normalized;
  const std::string_view t = prepare(text, repaired, normalized);
  const size_t n = t.size();
  DI_CHECK(n < (uint64_t{1} << 32), "text of {} bytes is too long to encode", n);

  // Cuts at character boundaries, roughly equal chunks.
  std::vector<size_t> cuts{0};
  for (size_t k = 1; k < static_cast<size_t>(num_chunks); ++k) {
    size_t c = n * k / static_cast<size_t>(num_chunks);
    while (c < n && (static_cast<unsigned char>(t[c]) & 0xC0) == 0x80) ++c;
    if (c > cuts.back() && c < n) cuts.push_back(c);
  }
  cuts.push_back(n);
  const size_t k_chunks = cuts.size() - 1;

  auto run_parallel = [&](size_t count, const std::function<void(size_t)>& fn) {
    std::exception_ptr error;
    std::mutex error_mu;
    pool.parallel_for(static_cast<int64_t>(count), 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        try {
          fn(static_cast<size_t>(i));
        } catch (...) {
          std::lock_guard g(error_mu);
          if (!error) error = std::current_exception();
        }
      }
    });
    if (error) std::rethrow_exception(error);
  };

  // A: first-stage scans per chunk.
  std::vector<std::vector<RegexSegment>> scans(k_chunks);
  std::vector<size_t> resumes(k_chunks);
  run_parallel(k_chunks, [&](size_t k) {
    resumes[k] = pre.scan_first_stage(t, cuts[k], cuts[k + 1], scans[k]);
  });

  // B: stitch.
  std::vector<RegexSegment> all;
  auto push = [&](RegexSegment s) {
    if (s.end <= s.begin) return;
    if (!s.is_match && !all.empty() && !all.back().is_match && all.back().end == s.begin) {
      all.back().end = s.end;  // an open gap continues into the next chunk
    } else {
      all.push_back(s);
    }
  };
  size_t cur = 0;  // where the serial scan resumes
  for (size_t k = 0; k < k_chunks; ++k) {
    const std::vector<RegexSegment>& scan = scans[k];
    while (cur < resumes[k]) {
      auto it = std::upper_bound(scan.begin(), scan.end(), cur,
                                 [](size_t pos, const RegexSegment& s) { return pos < s.begin; });
      const size_t j =
          static_cast<size_t>(it - scan.begin()) - 1;  // scan[j].begin <= cur < scan[j].end
      const RegexSegment& s = scan[j];
      if (!s.is_match || s.begin == cur) {
        push({static_cast<uint32_t>(cur), s.end, s.is_match});
        for (size_t i = j + 1; i < scan.size(); ++i) push(scan[i]);
        cur = resumes[k];
        break;
      }
      // Inside one of this chunk's matches: step the serial scan by one match.
      std::vector<RegexSegment> step;
      size_t next = pre.scan_first_stage(t, cur, s.end, step);
      for (const RegexSegment& x : step) push(x);
      cur = next;
    }
  }

  std::vector<Span> first;
  pre.finish_first_stage(all, first);

  // C: later stages + BPE on groups of first-stage pieces.
  std::vector<size_t> group_begin;
  for (size_t g = 0, i = 0; g < k_chunks; ++g) {
    const size_t target = n * g / k_chunks;
    while (i < first.size() && first[i].begin < target) ++i;
    group_begin.push_back(i);
  }
  group_begin.push_back(first.size());
  std::vector<std::vector<TokenId>> ids(k_chunks);
  run_parallel(k_chunks, [&](size_t g) {
    std::vector<Span> pieces;
    pre.split_after_first(t, first.data() + group_begin[g], group_begin[g + 1] - group_begin[g],
                          pieces);
    ids[g].reserve((pieces.empty() ? 0 : pieces.back().end - pieces.front().begin) / 3 + 8);
    for (const Span& s : pieces)
      core_->model.encode_piece(t.substr(s.begin, s.end - s.begin), ids[g]);
  });
  std::vector<TokenId> out;
  size_t total = 0;
  for (const auto& v : ids) total += v.size();
  out.reserve(total);
  for (const auto& v : ids) out.insert(out.end(), v.begin(), v.end());
  return out;
}

Result<std::vector<AddedToken>> parse_added_tokens(const nlohmann::json& root) {
  std::vector<AddedToken> added;
  if (!root.contains("added_tokens") || root.at("added_tokens").is_null()) return added;
  for (const auto& node : root.at("added_tokens")) {
    AddedToken t;
    t.id = node.at("id").get<TokenId>();
    t.content = node.at("content").get<std::string>();
    t.special = node.value("special", false);
    t.lstrip = node.value("lstrip", false);
    t.rstrip = node.value("rstrip", false);
    t.normalized = node.value("normalized", !t.special);
    t.single_word = node.value("single_word", false);
    if (t.content.empty())
      return make_status(StatusCode::kInvalidArgument, "added token {} is empty", t.id);
    added.push_back(std::move(t));
  }
  return added;
}

Status check_decoder(const nlohmann::json& root) {
  const auto& decoder = root.contains("decoder") ? root.at("decoder") : nlohmann::json();
  std::string type = decoder.is_null() ? "null" : decoder.value("type", "");
  if (type != "ByteLevel") {
    return make_status(StatusCode::kUnimplemented, "unsupported decoder {:?}: only ByteLevel",
                       type);
  }
  return Status::ok();
}

}  // namespace

Result<std::shared_ptr<const Tokenizer>> Tokenizer::from_json(std::string_view json_text) {
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    return make_status(StatusCode::kInvalidArgument, "tokenizer.json is not valid JSON: {}",
                       e.what());
  }
  if (!root.is_object() || !root.contains("model")) {
    return Status(StatusCode::kInvalidArgument, "tokenizer.json has no \"model\"");
  }
  auto core = std::make_shared<Core>();
  auto normalizer =
      Normalizer::from_json(root.contains("normalizer") ? root.at("normalizer") : nlohmann::json());
  if (!normalizer) return normalizer.status();
  core->normalizer = std::move(normalizer.value());
  auto pre = PreTokenizer::from_json(root.contains("pre_tokenizer") ? root.at("pre_tokenizer")
                                                                    : nlohmann::json());
  if (!pre) return pre.status();
  core->pre_tokenizer = std::move(pre.value());
  DI_RETURN_IF_ERROR(check_decoder(root));
  auto model = BpeModel::from_json(root.at("model"));
  if (!model) return model.status();
  core->model = std::move(model.value());
  Result<std::vector<AddedToken>> added = [&]() -> Result<std::vector<AddedToken>> {
    try {
      return parse_added_tokens(root);
    } catch (const nlohmann::json::exception& e) {
      return make_status(StatusCode::kInvalidArgument, "bad added_tokens: {}", e.what());
    }
  }();
  if (!added) return added.status();
  return std::shared_ptr<const Tokenizer>(
      std::make_shared<ByteLevelBpeTokenizer>(std::move(core), std::move(added.value())));
}

Result<std::shared_ptr<const Tokenizer>> Tokenizer::from_file(const std::string& path) {
  std::filesystem::path p(path);
  std::error_code ec;
  if (std::filesystem::is_directory(p, ec)) p /= "tokenizer.json";
  std::ifstream in(p, std::ios::binary);
  if (!in) return make_status(StatusCode::kNotFound, "cannot open tokenizer file {}", p.string());
  std::stringstream buffer;
  buffer << in.rdbuf();
  auto tok = from_json(buffer.str());
  if (!tok)
    return Status(tok.status().code(), fmt::format("{}: {}", p.string(), tok.status().message()));
  return tok;
}

}  // namespace di::recipe
