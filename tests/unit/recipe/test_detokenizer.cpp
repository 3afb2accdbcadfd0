// IncrementalDetokenizer: streamed output is always complete UTF-8 and concatenates to the full decode.
#include <gtest/gtest.h>

#include "recipe/control_tokens.h"
#include "recipe/incremental_detokenizer.h"
#include "recipe/unicode.h"
#include "unit/recipe/tokenizer_corpus.h"

namespace di::recipe {
namespace {

using testing::base_tokenizer;

const std::vector<std::string> kMultiByteTexts = {
    "你好，世界！深度学习模型的推理服务。",
    "日本語のテキスト：東京は日本の首都です。",
    "한국어 문장입니다.",
    "Family: 👨‍👩‍👧‍👦 flags 🇺🇸🇨🇳 🏴󠁧󠁢󠁳󠁣󠁴󠁿 keycap 1️⃣ skin 👍🏽",
    "😀😃😄😁🎉🎉 𠀀𠀁𪚥",
    "Combining: ǹ̷̢͉̫ỏ̶̧̫͙r̷̨̛͚m̴̛̺̳a̵̡̝͐l̶̲̈́",
};

// Feeds ids in chunks of the given sizes (cycled); checks each emitted piece; returns the concatenation.
std::string stream(const std::shared_ptr<const Tokenizer>& tok, const std::vector<TokenId>& ids,
                   const std::vector<size_t>& chunk_sizes, IncrementalDetokenizer::Options opts = {}) {
  IncrementalDetokenizer detok(tok, opts);
  std::string out;
  size_t i = 0, c = 0;
  while (i < ids.size()) {
    size_t n = std::min(chunk_sizes[c++ % chunk_sizes.size()], ids.size() - i);
    std::string piece = detok.push(std::span<const TokenId>(ids.data() + i, n));
    EXPECT_TRUE(unicode::is_valid(piece)) << "partial UTF-8 emitted";
    EXPECT_LE(detok.held_bytes(), 3u);
    out += piece;
    i += n;
  }
  out += detok.flush();
  EXPECT_EQ(detok.held_bytes(), 0u);
  return out;
}

class Detokenizer : public ::testing::TestWithParam<std::string> {};

TEST_P(Detokenizer, OneTokenAtATimeNeverBreaksACharacter) {
  auto tok = base_tokenizer(GetParam());
  for (const std::string& text : kMultiByteTexts) {
    const auto ids = tok->encode_ordinary(text);
    // The premise: some of these ids end inside a character, so per-id decoding would break them.
    size_t partial = 0;
    for (TokenId id : ids) partial += !unicode::is_valid(tok->token_bytes(id));
    IncrementalDetokenizer detok(tok);
    std::string out;
    for (TokenId id : ids) {
      std::string piece = detok.push(id);
      EXPECT_TRUE(unicode::is_valid(piece));
      EXPECT_EQ(piece.find("\uFFFD"), std::string::npos) << text;
      out += piece;
    }
    out += detok.flush();
    EXPECT_EQ(out, GetParam() == "qwen3" ? unicode::nfc(text) : text);
    if (text.find("👨") != std::string::npos) {
      EXPECT_GT(partial, 0u) << "expected emoji split across tokens";
    }
  }
}

TEST_P(Detokenizer, AnyChunkingEqualsTheFullDecodeOnTheCorpus) {
  auto tok = base_tokenizer(GetParam());
  for (const std::string& text : testing::corpus()) {
    const auto ids = tok->encode_with_special(text);
    const std::string full = unicode::repair(tok->decode(ids));
    for (const auto& sizes : std::vector<std::vector<size_t>>{{1}, {2}, {3, 1}, {5, 2, 7}, {ids.size() + 1}}) {
      ASSERT_EQ(stream(tok, ids, sizes), full) << testing::fnv1a64(text);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, Detokenizer, ::testing::Values("deepseek_v3", "qwen3", "llama3"));

TEST(Detokenizer, HoldsOnlyTheIncompleteTail) {
  auto tok = base_tokenizer("qwen3");
  // Byte-level tokens for the single bytes of "中" (E4 B8 AD).
  const TokenId b0 = *tok->token_to_id("ä"), b1 = *tok->token_to_id("¸"), b2 = *tok->token_to_id("Ń");
  ASSERT_EQ(tok->token_bytes(b0), "\xe4");
  ASSERT_EQ(tok->token_bytes(b1), "\xb8");
  ASSERT_EQ(tok->token_bytes(b2), "\xad");
  IncrementalDetokenizer detok(tok);
  EXPECT_EQ(detok.push(b0), "");
  EXPECT_EQ(detok.held_bytes(), 1u);
  EXPECT_EQ(detok.push(b1), "");
  EXPECT_EQ(detok.push(b2), "中");
  EXPECT_EQ(detok.held_bytes(), 0u);
  // A sequence that can never complete is replaced right away, like a lossy full decode.
  const TokenId a = *tok->token_to_id("a");
  EXPECT_EQ(detok.push(b0), "");
  EXPECT_EQ(detok.push(a), "\uFFFD" "a");
  // Flush turns a dangling lead byte into U+FFFD.
  EXPECT_EQ(detok.push(b0), "");
  EXPECT_EQ(detok.flush(), "\uFFFD");
  EXPECT_EQ(detok.flush(), "");
}

TEST(Detokenizer, SkipsSpecialTokensOnRequest) {
  auto tok = base_tokenizer("qwen3");
  const auto ids = tok->encode_with_special("<|im_start|>assistant\n<think>ok</think>好<|im_end|>");
  EXPECT_EQ(stream(tok, ids, {1}), "<|im_start|>assistant\n<think>ok</think>好<|im_end|>");
  EXPECT_EQ(stream(tok, ids, {1}, {.skip_special = true}), "assistant\n<think>ok</think>好");

  auto v31 = make_family_tokenizer(*base_tokenizer("deepseek_v3"), ModelFamily::kDeepSeekV31).value();
  const auto ds = v31->encode_with_special("<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜><think>嗯</think>");
  EXPECT_EQ(stream(v31, ds, {1}, {.skip_special = true}), "<｜User｜>hi<｜Assistant｜><think>嗯</think>")
      << "only BOS is special in the DeepSeek V3 file";
}

}  // namespace
}  // namespace di::recipe
