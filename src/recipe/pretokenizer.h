#pragma once
// Pre-tokenization: cuts normalized text into the pieces that BPE encodes one by one. Supports the
// HF pre-tokenizers byte-level files use: Sequence, Split (regex or string; behaviours Removed,
// Isolated, MergedWithPrevious, MergedWithNext, Contiguous; invert) and ByteLevel
// (add_prefix_space, use_regex = the GPT-2 split).
//
// Invariant the parallel encoder builds on: every stage after the first works on each piece of the
// previous stage separately, so once the first stage's pieces are known, any contiguous group of
// them can be finished (later stages + BPE) independently of the others.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"
#include "recipe/regex.h"

namespace di::recipe {

struct Span {
  uint32_t begin = 0, end = 0;  // byte offsets into the text being encoded
};

// A raw regex segment: a match or the gap before it, as the scan found it. (Not renderer.h's
// Segment: one name per type in di::recipe, or vector<Segment> instantiations collide — ODR.)
struct RegexSegment {
  uint32_t begin = 0, end = 0;
  bool is_match = false;
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

class PreTokenizer {
 public:
  // `node` is tokenizer.json's "pre_tokenizer" (may be null: the whole text is one piece).
  static Result<PreTokenizer> from_json(const nlohmann::json& node);

  // Splits `text` into pieces. Returns the text the spans index into: `text` itself, or `storage`
  // when a ByteLevel stage with add_prefix_space inserted spaces.
  std::string_view split(std::string_view text, std::string& storage, std::vector<Span>& out) const;

  // ---- the parallel path (see the invariant above) ----
  // True when the first stage is a regex split over the whole text and no stage inserts text.
  bool can_split_in_parallel() const { return parallel_ok_; }
  // Scans the first stage's regex from `start` over the whole `text`, appending raw segments, until
  // the scan resumes at a position >= `stop`. If no match starts in [pos, stop) the last segment is
  // an open gap [pos, stop) whose true end is decided by the next chunk. Returns the resume
  // position.
  size_t scan_first_stage(std::string_view text, size_t start, size_t stop,
                          std::vector<RegexSegment>& out) const;
  // Applies the first stage's behaviour to the complete raw segment list.
  void finish_first_stage(const std::vector<RegexSegment>& segments, std::vector<Span>& out) const;
  // Runs the stages after the first on each span, appending the final pieces.
  void split_after_first(std::string_view text, const Span* spans, size_t num_spans,
                         std::vector<Span>& out) const;

 private:
  struct Stage {
    enum class Kind { kSplit, kByteLevel } kind = Kind::kSplit;
    std::optional<Regex> regex;  // kSplit, or kByteLevel with use_regex
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
    bool add_prefix_space = false;  // kByteLevel
  };
  static Status add_stage(const nlohmann::json& node, std::vector<Stage>& stages);
  static void scan(const Stage& stage, std::string_view subject, size_t start, size_t stop,
                   std::vector<RegexSegment>& out, size_t* resume);
  static void apply_behavior(const Stage& stage, const std::vector<RegexSegment>& segments,
                             uint32_t base, std::vector<Span>& out);
  void run_stage(const Stage& stage, std::string_view text, const std::vector<Span>& in,
                 std::vector<Span>& out, std::vector<RegexSegment>& scratch) const;

  std::vector<Stage> stages_;
  size_t first_split_ = 0;  // index of the first stage that splits; stages before it are no-ops
  bool parallel_ok_ = false;
};

}  // namespace di::recipe
