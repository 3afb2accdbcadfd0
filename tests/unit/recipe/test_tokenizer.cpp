// Tokenizer tests against the real DeepSeek V3, Qwen3 and Llama 3 tokenizer.json files, with reference
// ids from HF `tokenizers` (tests/fixtures/tokenizer/refs_*.json, scripts/gen_tokenizer_refs.py).
#include <gtest/gtest.h>
#include <openssl/sha.h>

#include <filesystem>

#include "recipe/bpe.h"
#include "recipe/control_tokens.h"
#include "recipe/pretokenizer.h"
#include "recipe/unicode.h"
#include "unit/recipe/tokenizer_corpus.h"

namespace di::recipe {
namespace {

using nlohmann::json;
using testing::base_tokenizer;
using testing::corpus;
using testing::read_file;
using testing::source_dir;

const std::vector<std::string> kBases = {"deepseek_v3", "qwen3", "llama3"};

std::string sha256_hex(const std::string& data) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), digest);
  std::string hex;
  for (unsigned char b : digest) hex += fmt::format("{:02x}", b);
  return hex;
}

// The text a lossless round trip gives back: the normalizer's output (Qwen3 applies NFC).
std::string expected_round_trip(const std::string& name, const std::string& text) {
  return name == "qwen3" ? unicode::nfc(text) : text;
}

std::shared_ptr<const Tokenizer> tokenizer_for(const std::string& name) {
  if (auto family = model_family_from_name(name); family && name.rfind("deepseek_v3_", 0) == 0) {
    return make_family_tokenizer(*base_tokenizer("deepseek_v3"), *family).value();
  }
  return base_tokenizer(name);
}

// ---- reference ids from HF tokenizers ------------------------------------------------------------

// Checks every case of a refs file written by scripts/gen_tokenizer_refs.py.
void check_refs(const std::string& name, const std::string& corpus_file, const std::string& refs_path) {
  const json refs = json::parse(read_file(refs_path));
  const std::string corpus_bytes = read_file(corpus_file);
  ASSERT_EQ(refs.at("corpus_sha256").get<std::string>(), sha256_hex(corpus_bytes))
      << refs_path << " was generated from another " << corpus_file << ": regenerate it";
  const std::vector<std::string> texts = json::parse(corpus_bytes).get<std::vector<std::string>>();
  const json& cases = refs.at("cases");
  ASSERT_EQ(cases.size(), texts.size());

  auto tok = tokenizer_for(name);
  for (const json& added : refs.at("added_tokens")) {
    EXPECT_EQ(tok->token_to_id(added.at("content").get<std::string>()), added.at("id").get<TokenId>())
        << added.dump();
  }
  int failures = 0;
  for (size_t i = 0; i < texts.size() && failures < 10; ++i) {
    const std::string& text = texts[i];
    const json& c = cases[i];
    const auto ids = c.at("ids").get<std::vector<TokenId>>();
    const auto ordinary = c.contains("ids_ordinary") ? c.at("ids_ordinary").get<std::vector<TokenId>>() : ids;
    auto ours = tok->encode_with_special(text);
    if (ours != ids) {
      ++failures;
      ADD_FAILURE() << name << " case " << i << " " << json(text).dump().substr(0, 200) << "\n  ours " << json(ours).dump()
                    << "\n  hf   " << json(ids).dump();
    }
    if (refs.at("added_tokens").empty()) {  // variants only add tokens: ordinary ids are the base's
      auto ours_ordinary = tok->encode_ordinary(text);
      if (ours_ordinary != ordinary) {
        ++failures;
        ADD_FAILURE() << name << " ordinary case " << i << " " << json(text).dump().substr(0, 200) << "\n  ours "
                      << json(ours_ordinary).dump() << "\n  hf   " << json(ordinary).dump();
      }
    }
    const std::string decoded = c.value("decoded", text);
    EXPECT_EQ(unicode::repair(tok->decode(ids)), decoded) << name << " case " << i;
    EXPECT_EQ(unicode::repair(tok->decode(ids, /*skip_special=*/true)), c.value("decoded_skip_special", decoded))
        << name << " case " << i;
  }
}

std::string fixture(const std::string& file) { return source_dir() + "/tests/fixtures/tokenizer/" + file; }

class HfRefs : public ::testing::TestWithParam<std::string> {};

TEST_P(HfRefs, IdsMatchHuggingFaceTokenizers) {
  const std::string path = fixture("refs_" + GetParam() + ".json");
  ASSERT_TRUE(std::filesystem::exists(path))
      << "missing " << path << ": run `python3 scripts/gen_tokenizer_refs.py` where HF tokenizers is "
      << "installed (the GPU machine) and commit tests/fixtures/tokenizer/refs_*.json";
  check_refs(GetParam(), fixture("corpus.json"), path);
}

// Short random mixes of U+0085 / U+FEFF / U+180E, marks, contractions and control spellings, where
// regex engines disagree (we follow Oniguruma's \s, as HF does).
class HfEdgeRefs : public ::testing::TestWithParam<std::string> {};

TEST_P(HfEdgeRefs, IdsMatchHuggingFaceTokenizers) {
  const std::string path = fixture("refs_edge_" + GetParam() + ".json");
  if (!std::filesystem::exists(path)) {
    GTEST_SKIP() << "MISSING " << path << ": run `python3 scripts/gen_tokenizer_refs.py` on the GPU machine";
  }
  check_refs(GetParam(), fixture("corpus_edge.json"), path);
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, HfEdgeRefs, ::testing::Values("deepseek_v3", "qwen3", "llama3"));

INSTANTIATE_TEST_SUITE_P(Tokenizers, HfRefs,
                         ::testing::Values("deepseek_v3", "qwen3", "llama3", "deepseek_v3_1", "deepseek_v3_2"));

// ---- properties on the real files ------------------------------------------------------------------

class RealTokenizer : public ::testing::TestWithParam<std::string> {};

TEST_P(RealTokenizer, DecodeOfEncodeIsTheTextForTheWholeCorpus) {
  auto tok = base_tokenizer(GetParam());
  for (const std::string& text : corpus()) {
    std::string expected = expected_round_trip(GetParam(), text);
    EXPECT_EQ(tok->decode(tok->encode_ordinary(text)), expected) << json(text).dump().substr(0, 200);
    EXPECT_EQ(tok->decode(tok->encode_with_special(text)), expected) << json(text).dump().substr(0, 200);
  }
}

TEST_P(RealTokenizer, ParallelEqualsSerialAtEverySeam) {
  auto tok = base_tokenizer(GetParam());
  std::vector<std::string> texts = {
      testing::bench_text(120 * 1024),
      std::string(20000, '7') + " 12 345 " + std::string(9999, '0'),  // digit groups of 1-3
      std::string(30000, ' ') + "x" + std::string(20000, '\n') + "y" + std::string(5000, '\t'),
      [] {
        std::string s;
        for (int i = 0; i < 4000; ++i) s += i % 7 == 0 ? "中文字符。" : "漢字かなカナ";
        return s;
      }(),
      [] {
        std::string s;
        for (int i = 0; i < 3000; ++i) s += i % 5 == 0 ? "👨‍👩‍👧‍👦 " : "😀";
        return s;
      }(),
      std::string(50000, 'a'),
      [] {
        std::string s;
        for (int i = 0; i < 5000; ++i) s += "word" + std::to_string(i * 7919 % 100003) + (i % 3 ? "  " : "\r\n ");
        return s;
      }(),
  };
  for (size_t t = 0; t < texts.size(); ++t) {
    const auto serial = tok->encode_ordinary(texts[t]);
    for (int chunks : {2, 3, 5, 8, 13, 31, 64}) {
      ASSERT_EQ(tok->encode_ordinary_parallel(texts[t], chunks), serial) << "text " << t << ", " << chunks << " chunks";
    }
  }
  const std::string big = testing::bench_text();
  EXPECT_EQ(tok->encode_ordinary_parallel(big), tok->encode_ordinary(big));
}

TEST_P(RealTokenizer, HeapAndSmallMergeLoopsAgree) {
  const json root = json::parse(read_file(testing::tokenizer_path(GetParam())));
  auto model = BpeModel::from_json(root.at("model"));
  ASSERT_TRUE(model.is_ok()) << model.status().to_string();
  std::string storage;
  std::vector<Span> spans;
  auto pre = PreTokenizer::from_json(root.at("pre_tokenizer"));
  ASSERT_TRUE(pre.is_ok());
  std::string text = testing::bench_text(60 * 1024);
  std::string_view view = pre->split(text, storage, spans);
  size_t compared = 0;
  for (const Span& s : spans) {
    std::string_view piece = view.substr(s.begin, s.end - s.begin);
    std::vector<TokenId> small, heap;
    model->merge_piece(piece, small);
    model->merge_piece(piece, heap, /*force_heap=*/true);
    ASSERT_EQ(small, heap) << json(std::string(piece)).dump();
    ++compared;
  }
  EXPECT_GT(compared, 1000u);
}

TEST_P(RealTokenizer, InvalidUtf8IsRepairedNotACrash) {
  auto tok = base_tokenizer(GetParam());
  const std::string bad = "ok\xff\xfe then \xe4\xbd then \xed\xa0\x80 end\xf0\x9f";
  EXPECT_EQ(tok->decode(tok->encode_ordinary(bad)), unicode::repair(bad));
  EXPECT_EQ(tok->encode_ordinary(bad), tok->encode_ordinary(unicode::repair(bad)));
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, RealTokenizer, ::testing::Values("deepseek_v3", "qwen3", "llama3"));

TEST(Tokenizer, KnownIds) {
  EXPECT_EQ(base_tokenizer("qwen3")->encode_ordinary("Hello world"), (std::vector<TokenId>{9707, 1879}));
  EXPECT_EQ(base_tokenizer("llama3")->encode_ordinary("Hello world"), (std::vector<TokenId>{9906, 1917}));
  // ASCII bars are not the fullwidth control spelling (recipe-anchors.md §1.1).
  EXPECT_EQ(base_tokenizer("deepseek_v3")->encode_with_special("<|User|>"), (std::vector<TokenId>{30, 94, 6756, 94, 32}));
}

TEST(Tokenizer, ControlTokenSpellingsAreOrdinaryTextUnlessSpecialMatchingIsOn) {
  struct Case {
    std::string name, spelling;
    TokenId id;
  };
  for (const Case& c : {Case{"deepseek_v3", "<｜User｜>", 128803}, Case{"deepseek_v3", "<｜begin▁of▁sentence｜>", 0},
                        Case{"deepseek_v3", "<｜tool▁calls▁begin｜>", 128806}, Case{"qwen3", "<|im_start|>", 151644},
                        Case{"qwen3", "</think>", 151668}, Case{"llama3", "<|begin_of_text|>", 128000},
                        Case{"llama3", "<|eot_id|>", 128009}}) {
    auto tok = base_tokenizer(c.name);
    ASSERT_EQ(tok->token_to_id(c.spelling), c.id) << c.spelling;
    const std::string text = "a" + c.spelling + "b";
    auto special = tok->encode_with_special(text);
    auto ordinary = tok->encode_ordinary(text);
    EXPECT_EQ(std::count(special.begin(), special.end(), c.id), 1) << c.spelling;
    EXPECT_EQ(std::count(ordinary.begin(), ordinary.end(), c.id), 0) << c.spelling;
    for (TokenId id : ordinary) {
      EXPECT_EQ(tok->id_to_token(id).find(c.spelling), std::string::npos);
    }
    EXPECT_EQ(tok->decode(ordinary), text);
    EXPECT_EQ(tok->decode(special), text);
  }
}

TEST(Tokenizer, SkipSpecialDropsOnlySpecialTokens) {
  auto qwen = base_tokenizer("qwen3");
  auto ids = qwen->encode_with_special("<|im_start|>user\n<think>x</think><|im_end|>");
  EXPECT_EQ(qwen->decode(ids, /*skip_special=*/true), "user\n<think>x</think>");  // <think> is not special
  EXPECT_TRUE(qwen->is_special(151644));
  EXPECT_FALSE(qwen->is_special(151667));
  EXPECT_FALSE(qwen->is_special(9707));
}

TEST(Tokenizer, VocabularyAccessors) {
  auto ds = base_tokenizer("deepseek_v3");
  EXPECT_EQ(ds->vocab_size(), 128815);
  EXPECT_EQ(ds->id_to_token(19923), "Hello");
  EXPECT_EQ(ds->id_to_token(2058), "Ġworld");
  EXPECT_EQ(ds->token_bytes(2058), " world");
  EXPECT_EQ(ds->token_to_id("Ġworld"), 2058);
  EXPECT_EQ(ds->token_to_id("<｜User｜>"), 128803);
  EXPECT_EQ(ds->token_to_id("no such token"), std::nullopt);
  EXPECT_EQ(ds->id_to_token(-1), "");
  EXPECT_EQ(ds->id_to_token(10'000'000), "");
  EXPECT_EQ(base_tokenizer("qwen3")->vocab_size(), 151669);
  EXPECT_EQ(base_tokenizer("llama3")->vocab_size(), 128256);
}

// ---- control-token variants --------------------------------------------------------------------------

TEST(ControlTokens, DeepSeekVariantsAddThinkAndDsmlAfterTheMaximumId) {
  auto base = base_tokenizer("deepseek_v3");
  ASSERT_EQ(base->token_to_id("<think>"), std::nullopt) << "the npm V3 vocab has no <think>";
  ASSERT_EQ(base->token_to_id("｜DSML｜"), std::nullopt);
  auto v31 = make_family_tokenizer(*base, ModelFamily::kDeepSeekV31).value();
  EXPECT_EQ(v31->token_to_id("<think>"), 128815);
  EXPECT_EQ(v31->token_to_id("</think>"), 128816);
  EXPECT_EQ(v31->vocab_size(), 128817);
  EXPECT_FALSE(v31->is_special(128815));
  auto v32 = make_family_tokenizer(*base, ModelFamily::kDeepSeekV32).value();
  EXPECT_EQ(v32->token_to_id("｜DSML｜"), 128817);

  const std::string markup = "<｜DSML｜invoke name=\"f\">x</｜DSML｜invoke></think>";
  auto special = v32->encode_with_special(markup);
  EXPECT_EQ(std::count(special.begin(), special.end(), 128817), 2);
  EXPECT_EQ(std::count(special.begin(), special.end(), 128816), 1);
  EXPECT_EQ(v32->decode(special), markup);
  auto ordinary = v32->encode_ordinary(markup);
  EXPECT_EQ(ordinary, base->encode_ordinary(markup));
  for (TokenId id : ordinary) EXPECT_LT(id, 128000);
  // The base tokenizer is unchanged.
  EXPECT_EQ(base->token_to_id("<think>"), std::nullopt);
}

TEST(ControlTokens, ExistingTokensAreKept) {
  auto qwen = base_tokenizer("qwen3");
  auto v31_on_qwen = make_family_tokenizer(*qwen, ModelFamily::kDeepSeekV31).value();
  EXPECT_EQ(v31_on_qwen->token_to_id("<think>"), 151667);
  EXPECT_EQ(v31_on_qwen->vocab_size(), qwen->vocab_size());
  EXPECT_TRUE(control_token_additions(ModelFamily::kQwen3).empty());
  EXPECT_EQ(model_family_from_name("deepseek_v3_2"), ModelFamily::kDeepSeekV32);
  EXPECT_EQ(model_family_from_name("nope"), std::nullopt);
}

TEST(AddedTokens, StripAndSingleWordFlags) {
  auto qwen = base_tokenizer("qwen3");
  AddedToken l{.id = -1, .content = "<L>", .lstrip = true};
  AddedToken r{.id = -1, .content = "<R>", .rstrip = true};
  AddedToken w{.id = -1, .content = "<W>", .single_word = true};
  auto tok = qwen->with_added_tokens({l, r, w}).value();
  const TokenId lid = *tok->token_to_id("<L>"), rid = *tok->token_to_id("<R>"), wid = *tok->token_to_id("<W>");
  EXPECT_EQ(lid, 151669);
  EXPECT_EQ(wid, 151671);
  auto cat = [](std::vector<TokenId> a, const std::vector<TokenId>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  // lstrip eats the spaces before the token, rstrip those after it.
  EXPECT_EQ(tok->encode_with_special("a  <L> b"), cat(cat(qwen->encode_ordinary("a"), {lid}), qwen->encode_ordinary(" b")));
  EXPECT_EQ(tok->encode_with_special("a <R>  b"), cat(cat(qwen->encode_ordinary("a "), {rid}), qwen->encode_ordinary("b")));
  // single_word: only when not glued to a word character.
  EXPECT_EQ(tok->encode_with_special("x <W> y"), cat(cat(qwen->encode_ordinary("x "), {wid}), qwen->encode_ordinary(" y")));
  EXPECT_EQ(tok->encode_with_special("x<W>y"), qwen->encode_ordinary("x<W>y"));
  EXPECT_EQ(tok->encode_with_special("é<W>"), qwen->encode_ordinary("é<W>"));
}

// ---- components on synthetic inputs ------------------------------------------------------------------

std::vector<std::string> pieces(const std::string& pre_tokenizer_json, const std::string& text) {
  auto pre = PreTokenizer::from_json(json::parse(pre_tokenizer_json));
  DI_CHECK(pre.is_ok(), "{}", pre.status().to_string());
  std::string storage;
  std::vector<Span> spans;
  std::string_view view = pre->split(text, storage, spans);
  std::vector<std::string> out;
  for (const Span& s : spans) out.emplace_back(view.substr(s.begin, s.end - s.begin));
  return out;
}

std::string split_json(const std::string& behavior, bool invert = false) {
  return R"({"type": "Split", "pattern": {"String": "-"}, "behavior": ")" + behavior +
         R"(", "invert": )" + (invert ? "true" : "false") + "}";
}

TEST(PreTokenizer, SplitBehaviorsFollowHuggingFace) {
  using V = std::vector<std::string>;
  const std::string text = "the-final--countdown";
  EXPECT_EQ(pieces(split_json("Removed"), text), (V{"the", "final", "countdown"}));
  EXPECT_EQ(pieces(split_json("Isolated"), text), (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(pieces(split_json("MergedWithPrevious"), text), (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(pieces(split_json("MergedWithNext"), text), (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(pieces(split_json("Contiguous"), text), (V{"the", "-", "final", "--", "countdown"}));
  EXPECT_EQ(pieces(split_json("Removed", /*invert=*/true), text), (V{"-", "-", "-"}));
  EXPECT_EQ(pieces(split_json("Isolated"), "-a-"), (V{"-", "a", "-"}));
  EXPECT_EQ(pieces(split_json("Isolated"), ""), V{});
}

TEST(PreTokenizer, ByteLevelRegexAndPrefixSpace) {
  using V = std::vector<std::string>;
  const std::string gpt2 = R"({"type": "ByteLevel", "add_prefix_space": true, "use_regex": true})";
  EXPECT_EQ(pieces(gpt2, "Hello world's  end"), (V{" Hello", " world", "'s", " ", " end"}));
  EXPECT_EQ(pieces(gpt2, " x"), (V{" x"}));
  const std::string plain = R"({"type": "ByteLevel", "add_prefix_space": false, "use_regex": false})";
  EXPECT_EQ(pieces(plain, "a b"), (V{"a b"}));
  EXPECT_FALSE(PreTokenizer::from_json(json::parse(gpt2)).value().can_split_in_parallel());
  EXPECT_FALSE(PreTokenizer::from_json(json::parse(R"({"type": "Whitespace"})")).is_ok());
}

TEST(PreTokenizer, WhitespaceIsOnigurumasNotPcre2s) {
  // U+180E is not White_Space since Unicode 6.3; PCRE2's \s still matches it.
  EXPECT_EQ(translate_onig_pattern(R"(\s+(?!\S)|[^\s\p{L}])").find("\\s"), std::string::npos);
  auto re = Regex::compile(R"(\s)").value();
  size_t b = 0, e = 0;
  EXPECT_FALSE(re.find("\u180e", 0, &b, &e));
  EXPECT_TRUE(re.find("\u3000", 0, &b, &e));
  EXPECT_TRUE(re.find("\u0085", 0, &b, &e));
  auto escaped = Regex::compile(R"(\\s)").value();  // a backslash then 's'
  EXPECT_TRUE(escaped.find("\\s", 0, &b, &e));
  EXPECT_FALSE(escaped.find(" ", 0, &b, &e));
}

TEST(Unicode, Nfc) {
  EXPECT_EQ(unicode::nfc("Cafe\u0301"), "Caf\u00e9");
  EXPECT_EQ(unicode::nfc("\u212b"), "\u00c5");                  // singleton decomposition
  EXPECT_EQ(unicode::nfc("\u1100\u1161\u11a8"), "\uac01");      // Hangul jamo compose
  EXPECT_EQ(unicode::nfc("a\u0301\u0328"), "\u0105\u0301");     // reordered: ogonek (202) before acute (230)
  EXPECT_EQ(unicode::nfc("e\u0301\u0300"), "\u00e9\u0300");
  EXPECT_EQ(unicode::nfc("\u0344"), "\u0308\u0301");            // composition exclusion
  EXPECT_EQ(unicode::nfc("plain ascii"), "plain ascii");
  EXPECT_EQ(unicode::nfd("\u00e9\uac01"), "e\u0301\u1100\u1161\u11a8");
  EXPECT_TRUE(unicode::is_nfc_quick("中文 😀 é"));
  EXPECT_FALSE(unicode::is_nfc_quick("e\u0301"));
}

TEST(Unicode, Utf8Repair) {
  EXPECT_EQ(unicode::repair("a\xff" "b"), "a\uFFFD" "b");
  EXPECT_EQ(unicode::repair("\xe4\xbd" "a"), "\uFFFD" "a");          // one U+FFFD per maximal subpart
  EXPECT_EQ(unicode::repair("\xed\xa0\x80"), "\uFFFD\uFFFD\uFFFD");  // surrogates are ill-formed
  EXPECT_EQ(unicode::repair("\xc0\xaf"), "\uFFFD\uFFFD");            // overlong
  EXPECT_EQ(unicode::incomplete_tail_length("ab\xe4\xbd"), 2u);
  EXPECT_EQ(unicode::incomplete_tail_length("ab\xe4\xbd\xa0"), 0u);
  EXPECT_EQ(unicode::incomplete_tail_length("\xf0\x9f\x98"), 3u);
  EXPECT_EQ(unicode::incomplete_tail_length("\xed\xa0"), 0u);        // can never complete
}

TEST(TokenizerLoading, ErrorsAreStatusesWithMessages) {
  auto missing = Tokenizer::from_file("/nonexistent/tokenizer.json");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  auto bad_json = Tokenizer::from_json("{not json");
  ASSERT_FALSE(bad_json.is_ok());
  EXPECT_NE(bad_json.status().message().find("not valid JSON"), std::string::npos);
  auto no_model = Tokenizer::from_json("{}");
  EXPECT_FALSE(no_model.is_ok());
  json root = json::parse(read_file(testing::tokenizer_path("qwen3")));
  root["normalizer"] = {{"type", "Lowercase"}};
  auto unsupported = Tokenizer::from_json(root.dump());
  ASSERT_FALSE(unsupported.is_ok());
  EXPECT_NE(unsupported.status().message().find("Lowercase"), std::string::npos);
}

}  // namespace
}  // namespace di::recipe
