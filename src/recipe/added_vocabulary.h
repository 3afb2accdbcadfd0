#pragma once
// Matching added tokens ("<｜User｜>", "<|im_start|>", "<think>") in text, as HF does before
// normalization: leftmost-longest over all contents, then the token's single_word / lstrip / rstrip
// flags. Two matchers exist per tokenizer: tokens with `normalized: false` are matched on the raw
// text; tokens with `normalized: true` on the normalized text between the first matches.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace di::recipe {

struct AddedToken;
using TokenId = int32_t;

class AddedTokenMatcher {
 public:
  struct Match {
    size_t begin, end;  // consumed bytes, stripped whitespace included
    TokenId id;
  };

  // `contents[i]` is what to look for (already normalized where the token is `normalized`).
  AddedTokenMatcher(const std::vector<const AddedToken*>& tokens, const std::vector<std::string>& contents);
  AddedTokenMatcher() = default;

  bool empty() const { return nodes_.size() <= 1; }
  // All matches in `text`, in order, not overlapping.
  void find_all(std::string_view text, std::vector<Match>& out) const;

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> edges;  // sorted by byte
    int32_t token = -1;                                     // index into tokens_ if a content ends here
  };
  int32_t child(int32_t node, unsigned char byte) const;

  std::vector<Node> nodes_{Node{}};
  std::vector<const AddedToken*> tokens_;
  bool first_byte_[256] = {};
};

}  // namespace di::recipe
