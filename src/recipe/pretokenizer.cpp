#include "recipe/pretokenizer.h"

#include <nlohmann/json.hpp>

namespace di::recipe {
namespace {

// The GPT-2 split that ByteLevel(use_regex = true) applies.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

Result<SplitBehavior> parse_behavior(const std::string& name) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return make_status(StatusCode::kInvalidArgument, "unknown Split behavior {:?}", name);
}

size_t next_char(std::string_view s, size_t i) {
  ++i;
  while (i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) ++i;
  return i;
}

}  // namespace

Status PreTokenizer::add_stage(const nlohmann::json& node, std::vector<Stage>& stages) {
  const std::string type = node.value("type", "");
  if (type == "Sequence") {
    for (const auto& child : node.at("pretokenizers")) DI_RETURN_IF_ERROR(add_stage(child, stages));
    return Status::ok();
  }
  Stage stage;
  if (type == "Split") {
    const auto& pattern = node.at("pattern");
    bool literal = pattern.contains("String");
    auto regex = Regex::compile(
        literal ? pattern.at("String").get<std::string>() : pattern.at("Regex").get<std::string>(),
        literal);
    if (!regex) return regex.status();
    auto behavior = parse_behavior(node.at("behavior").get<std::string>());
    if (!behavior) return behavior.status();
    stage.regex = std::move(regex.value());
    stage.behavior = behavior.value();
    stage.invert = node.value("invert", false);
  } else if (type == "ByteLevel") {
    stage.kind = Stage::Kind::kByteLevel;
    stage.add_prefix_space = node.value("add_prefix_space", false);
    if (node.value("use_regex", true)) {
      auto regex = Regex::compile(kGpt2Pattern);
      if (!regex) return regex.status();
      stage.regex = std::move(regex.value());
    }
  } else {
    return make_status(StatusCode::kUnimplemented, "unsupported pre_tokenizer type {:?}", type);
  }
  stages.push_back(std::move(stage));
  return Status::ok();
}

Result<PreTokenizer> PreTokenizer::from_json(const nlohmann::json& node) {
  PreTokenizer pt;
  if (!node.is_null()) {
    try {
      DI_RETURN_IF_ERROR(add_stage(node, pt.stages_));
    } catch (const nlohmann::json::exception& e) {
      return make_status(StatusCode::kInvalidArgument, "bad pre_tokenizer: {}", e.what());
    }
  }
  pt.first_split_ = pt.stages_.size();
  for (size_t i = 0; i < pt.stages_.size(); ++i) {
    const Stage& s = pt.stages_[i];
    if (s.add_prefix_space) break;  // inserts text: stop looking, no parallel path
    if (s.regex) {
      pt.first_split_ = i;
      break;
    }
  }
  pt.parallel_ok_ = pt.first_split_ < pt.stages_.size();
  for (const Stage& s : pt.stages_) pt.parallel_ok_ = pt.parallel_ok_ && !s.add_prefix_space;
  return pt;
}

// The HF `find_matches` loop: leftmost-first matches, with the gaps between them as non-matches.
// Empty matches are skipped (the scan moves one character on).
void PreTokenizer::scan(const Stage& stage, std::string_view subject, size_t start, size_t stop,
                        std::vector<RegexSegment>& out, size_t* resume) {
  size_t pos = start;
  size_t search = start;
  while (pos < stop && pos < subject.size()) {
    size_t mb = 0, me = 0;
    size_t max_start = stop >= subject.size() ? std::string_view::npos : stop - 1;
    if (!stage.regex->find(subject, search, &mb, &me, max_start)) {
      // No match starts before `stop`: the gap runs at least to `stop` (to the end if stop ==
      // size).
      size_t end = std::min(stop, subject.size());
      out.push_back({static_cast<uint32_t>(pos), static_cast<uint32_t>(end), false});
      pos = end;
      break;
    }
    if (me == mb) {  // empty match: not a piece; look again one character later
      search = next_char(subject, mb);
      size_t limit = std::min(stop, subject.size());
      if (search >= limit) {
        out.push_back({static_cast<uint32_t>(pos), static_cast<uint32_t>(limit), false});
        pos = limit;
        break;
      }
      continue;
    }
    if (mb > pos) out.push_back({static_cast<uint32_t>(pos), static_cast<uint32_t>(mb), false});
    out.push_back({static_cast<uint32_t>(mb), static_cast<uint32_t>(me), true});
    pos = search = me;
  }
  *resume = pos;
}

void PreTokenizer::apply_behavior(const Stage& stage, const std::vector<RegexSegment>& segments,
                                  uint32_t base, std::vector<Span>& out) {
  auto emit = [&](uint32_t b, uint32_t e) {
    if (e > b) out.push_back({base + b, base + e});
  };
  const size_t n = segments.size();
  auto matched = [&](size_t i) { return segments[i].is_match != stage.invert; };
  switch (stage.behavior) {
    case SplitBehavior::kIsolated:
      for (const RegexSegment& s : segments) emit(s.begin, s.end);
      break;
    case SplitBehavior::kRemoved:
      for (size_t i = 0; i < n; ++i) {
        if (!matched(i)) emit(segments[i].begin, segments[i].end);
      }
      break;
    case SplitBehavior::kMergedWithPrevious: {
      // A match joins the piece before it unless that piece is itself a match.
      size_t first = out.size();
      bool previous_match = false;
      for (size_t i = 0; i < n; ++i) {
        bool m = matched(i);
        if (m && !previous_match && out.size() > first) {
          out.back().end = base + segments[i].end;
        } else {
          emit(segments[i].begin, segments[i].end);
        }
        previous_match = m;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      // Mirror image: a match joins the piece after it unless that piece is itself a match.
      std::vector<Span> reversed;
      bool next_match = false;
      for (size_t i = n; i-- > 0;) {
        bool m = matched(i);
        if (m && !next_match && !reversed.empty()) {
          reversed.back().begin = base + segments[i].begin;
        } else if (segments[i].end > segments[i].begin) {
          reversed.push_back({base + segments[i].begin, base + segments[i].end});
        }
        next_match = m;
      }
      out.insert(out.end(), reversed.rbegin(), reversed.rend());
      break;
    }
    case SplitBehavior::kContiguous: {
      // Runs of consecutive matches (or non-matches) become one piece.
      size_t first = out.size();
      bool previous_match = false;
      for (size_t i = 0; i < n; ++i) {
        bool m = matched(i);
        if (m == previous_match && out.size() > first) {
          out.back().end = base + segments[i].end;
        } else {
          emit(segments[i].begin, segments[i].end);
        }
        previous_match = m;
      }
      break;
    }
  }
}

void PreTokenizer::run_stage(const Stage& stage, std::string_view text, const std::vector<Span>& in,
                             std::vector<Span>& out, std::vector<RegexSegment>& scratch) const {
  for (const Span& span : in) {
    std::string_view piece = text.substr(span.begin, span.end - span.begin);
    scratch.clear();
    size_t resume = 0;
    scan(stage, piece, 0, piece.size(), scratch, &resume);
    apply_behavior(stage, scratch, span.begin, out);
  }
}

std::string_view PreTokenizer::split(std::string_view text, std::string& storage,
                                     std::vector<Span>& out) const {
  DI_CHECK(text.size() < (uint64_t{1} << 32), "text of {} bytes is too long to pre-tokenize",
           text.size());
  std::vector<Span> current{{0, static_cast<uint32_t>(text.size())}};
  std::vector<Span> next;
  std::vector<RegexSegment> scratch;
  if (text.empty()) current.clear();
  for (const Stage& stage : stages_) {
    if (stage.add_prefix_space) {
      // HF prepends a space to every current piece that does not start with one.
      std::string rebuilt;
      next.clear();
      for (const Span& s : current) {
        uint32_t begin = static_cast<uint32_t>(rebuilt.size());
        if (text[s.begin] != ' ') rebuilt.push_back(' ');
        rebuilt.append(text.substr(s.begin, s.end - s.begin));
        next.push_back({begin, static_cast<uint32_t>(rebuilt.size())});
      }
      storage = std::move(rebuilt);
      text = storage;
      current.swap(next);
    }
    if (!stage.regex) continue;
    next.clear();
    run_stage(stage, text, current, next, scratch);
    current.swap(next);
  }
  out.insert(out.end(), current.begin(), current.end());
  return text;
}

size_t PreTokenizer::scan_first_stage(std::string_view text, size_t start, size_t stop,
                                      std::vector<RegexSegment>& out) const {
  size_t resume = start;
  scan(stages_[first_split_], text, start, stop, out, &resume);
  return resume;
}

void PreTokenizer::finish_first_stage(const std::vector<RegexSegment>& segments,
                                      std::vector<Span>& out) const {
  apply_behavior(stages_[first_split_], segments, 0, out);
}

void PreTokenizer::split_after_first(std::string_view text, const Span* spans, size_t num_spans,
                                     std::vector<Span>& out) const {
  std::vector<Span> current(spans, spans + num_spans);
  std::vector<Span> next;
  std::vector<RegexSegment> scratch;
  for (size_t i = first_split_ + 1; i < stages_.size(); ++i) {
    if (!stages_[i].regex) continue;
    next.clear();
    run_stage(stages_[i], text, current, next, scratch);
    current.swap(next);
  }
  out.insert(out.end(), current.begin(), current.end());
}

}  // namespace di::recipe
