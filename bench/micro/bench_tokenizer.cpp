// Tokenizer throughput on ~300 KiB of mixed text (the corpus, rotated and repeated; see bench_text()).
// scripts/bench_hf_tokenizers.py measures HF `tokenizers` on the same text (same length and FNV-1a).
//
//   build/bench/micro/bench_tokenizer            (run from the repository root)
#include <benchmark/benchmark.h>

#include "core/thread_pool.h"
#include "recipe/incremental_detokenizer.h"
#include "unit/recipe/tokenizer_corpus.h"

namespace {

using namespace di::recipe;

const std::string& text() {
  static const std::string t = testing::bench_text();
  return t;
}

void set_throughput(benchmark::State& state, size_t num_tokens) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text().size()));
  state.counters["tokens"] = static_cast<double>(num_tokens);
  state.counters["tok/s"] =
      benchmark::Counter(static_cast<double>(num_tokens), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_EncodeOrdinary(benchmark::State& state, const std::string& name) {
  auto tok = testing::base_tokenizer(name);
  size_t n = 0;
  for (auto _ : state) n = tok->encode_ordinary(text()).size();
  set_throughput(state, n);
}

void BM_EncodeWithSpecial(benchmark::State& state, const std::string& name) {
  auto tok = testing::base_tokenizer(name);
  size_t n = 0;
  for (auto _ : state) n = tok->encode_with_special(text()).size();
  set_throughput(state, n);
}

void BM_EncodeOrdinaryParallel(benchmark::State& state, const std::string& name) {
  auto tok = testing::base_tokenizer(name);
  size_t n = 0;
  for (auto _ : state) n = tok->encode_ordinary_parallel(text()).size();
  set_throughput(state, n);
  state.counters["threads"] = di::ThreadPool::global().num_threads();
}

void BM_DetokenizeOneByOne(benchmark::State& state, const std::string& name) {
  auto tok = testing::base_tokenizer(name);
  const auto ids = tok->encode_ordinary(text());
  for (auto _ : state) {
    IncrementalDetokenizer detok(tok);
    size_t bytes = 0;
    for (TokenId id : ids) bytes += detok.push(id).size();
    bytes += detok.flush().size();
    benchmark::DoNotOptimize(bytes);
  }
  set_throughput(state, ids.size());
}

void register_all() {
  for (const std::string name : {"deepseek_v3", "qwen3", "llama3"}) {
    benchmark::RegisterBenchmark(("encode_ordinary/" + name).c_str(), BM_EncodeOrdinary, name)->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("encode_with_special/" + name).c_str(), BM_EncodeWithSpecial, name)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("encode_ordinary_parallel/" + name).c_str(), BM_EncodeOrdinaryParallel, name)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark(("detokenize_one_by_one/" + name).c_str(), BM_DetokenizeOneByOne, name)
        ->Unit(benchmark::kMillisecond);
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::AddCustomContext("text_bytes", std::to_string(text().size()));
  benchmark::AddCustomContext("text_fnv1a64", fmt::format("{:016x}", testing::fnv1a64(text())));
  benchmark::AddCustomContext("pool_threads", std::to_string(di::ThreadPool::global().num_threads()));
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
