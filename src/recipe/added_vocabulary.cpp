#include "recipe/added_vocabulary.h"

#include <algorithm>

#include "recipe/regex.h"
#include "recipe/tokenizer.h"
#include "recipe/unicode.h"

namespace di::recipe {
namespace {

// Rust's `char::is_alphanumeric() || c == '_'`, HF's word character for single_word tokens.
bool is_word_char(std::string_view ch) {
  static const Regex kWord = Regex::compile(R"([\p{Alphabetic}\p{N}_])").value();
  size_t b = 0, e = 0;
  return kWord.find(ch, 0, &b, &e, 0);
}

std::string_view last_char(std::string_view s) {
  size_t i = s.size();
  while (i > 0 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) --i;
  return s.substr(i > 0 ? i - 1 : 0);
}

std::string_view first_char(std::string_view s) {
  char32_t cp = 0;
  size_t len = unicode::decode_one(s.data(), s.size(), &cp);
  return s.substr(0, std::max<size_t>(len, 1));
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<const AddedToken*>& tokens,
                                     const std::vector<std::string>& contents)
    : tokens_(tokens) {
  for (size_t t = 0; t < tokens.size(); ++t) {
    const std::string& s = contents[t];
    if (s.empty()) continue;
    int32_t node = 0;
    for (unsigned char byte : s) {
      int32_t next = child(node, byte);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_.emplace_back();
        auto& edges = nodes_[node].edges;
        edges.insert(std::lower_bound(edges.begin(), edges.end(), std::pair<unsigned char, int32_t>{byte, -1}),
                     {byte, next});
      }
      node = next;
    }
    if (nodes_[node].token < 0) nodes_[node].token = static_cast<int32_t>(t);  // first content wins
    first_byte_[static_cast<unsigned char>(s[0])] = true;
  }
}

int32_t AddedTokenMatcher::child(int32_t node, unsigned char byte) const {
  const auto& edges = nodes_[node].edges;
  auto it = std::lower_bound(edges.begin(), edges.end(), std::pair<unsigned char, int32_t>{byte, -1});
  return it != edges.end() && it->first == byte ? it->second : -1;
}

void AddedTokenMatcher::find_all(std::string_view text, std::vector<Match>& out) const {
  if (empty()) return;
  size_t consumed = 0;  // end of the previous match: lstrip never reaches before it
  size_t i = 0;
  while (i < text.size()) {
    if (!first_byte_[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    // Longest content starting at i.
    int32_t node = 0, best = -1;
    size_t best_end = i;
    for (size_t j = i; j < text.size(); ++j) {
      node = child(node, static_cast<unsigned char>(text[j]));
      if (node < 0) break;
      if (nodes_[node].token >= 0) {
        best = nodes_[node].token;
        best_end = j + 1;
      }
    }
    if (best < 0) {
      ++i;
      continue;
    }
    const AddedToken& tok = *tokens_[best];
    size_t start = i, stop = best_end;
    i = best_end;  // matches never overlap, even a discarded one
    if (tok.single_word) {
      bool start_ok = start == 0 || !is_word_char(last_char(text.substr(0, start)));
      bool stop_ok = stop == text.size() || !is_word_char(first_char(text.substr(stop)));
      if (!start_ok || !stop_ok) continue;
    }
    if (tok.lstrip) {
      while (start > consumed) {
        std::string_view ch = last_char(text.substr(0, start));
        char32_t cp = 0;
        if (unicode::decode_one(ch.data(), ch.size(), &cp) == 0 || !unicode::is_whitespace(cp)) break;
        start -= ch.size();
      }
    }
    if (tok.rstrip) {
      while (stop < text.size()) {
        char32_t cp = 0;
        size_t len = unicode::decode_one(text.data() + stop, text.size() - stop, &cp);
        if (len == 0 || !unicode::is_whitespace(cp)) break;
        stop += len;
      }
      i = stop;
    }
    out.push_back({start, stop, tok.id});
    consumed = stop;
  }
}

}  // namespace di::recipe
