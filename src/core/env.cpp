#include "core/env.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <iterator>

#include "core/error.h"

extern char** environ;

namespace di::env {
namespace {

constexpr std::string_view kPrefix = "DEEPINFER_";

// Sorted by name (a test checks). Most are the CUDA backend's A/B switches: each keeps the
// path a measurement replaced, so that one binary can time both (docs/performance.md names the
// runs); "unset" is the default the measurements chose.
constexpr Variable kVariables[] = {
    {"DEEPINFER_ATTN_DECODE", "generic", "the GQA decode kernels where they take the shape",
     "generic: decode attention on the generic paged kernel (A/B)"},
    {"DEEPINFER_ATTN_LATE_TRIGGER", "0|1", "1",
     "0: the decode attention kernels trigger their PDL dependents at their start, not after "
     "their wait (run 42)"},
    {"DEEPINFER_ATTN_MMA_MTILES", "1|2", "1", "prefill attention (mma): 16-row tiles per warp"},
    {"DEEPINFER_ATTN_MMA_WARPS", "4|8", "4", "prefill attention (mma): warps per CTA"},
    {"DEEPINFER_ATTN_PREFILL", "wgmma|mma|simt", "wgmma where the kernel takes the shape",
     "the prefill attention kernel"},
    {"DEEPINFER_ATTN_SPLIT", "0|16..", "64 (0: the same)",
     "GQA decode KV split size in keys (a fixed value keeps batch invariance)"},
    {"DEEPINFER_ATTN_WGMMA_PINGPONG", "0|1", "1",
     "0: the wgmma prefill kernel without consumer ping-pong"},
    {"DEEPINFER_BATCH_INVARIANT", "0|1", "0",
     "1: kernels whose layout would follow the batch pin one layout (design.md, Determinism)"},
    {"DEEPINFER_BIN", "", "build/bin/deepinfer",
     "read by the e2e test scripts, not by deepinfer: the binary they start"},
    {"DEEPINFER_COMBINE_WARP", "0|1", "1",
     "0: the GQA split combine with block barriers instead of one warp per row (run 39)"},
    {"DEEPINFER_EP_LATENCY", "0|1", "1",
     "0: serve --dp-size keeps the throughput EP exchange (host syncs, no decode graphs)"},
    {"DEEPINFER_EP_PEER", "0|1", "1",
     "0: the DP group's decode EP exchange over NCCL instead of peer to peer"},
    {"DEEPINFER_GEMV_BULK", "0|1", "by size: >= 64 MB of weights",
     "the small-M GEMV's first items by bulk copy (1) or registers (0)"},
    {"DEEPINFER_GEMV_EARLY", "0|1", "by shape",
     "one-row GEMV: the second item after the wait on even SMs (1) or never (0) (run 42)"},
    {"DEEPINFER_GEMV_MAX_ROWS", "0..8", "1",
     "the fused small-M GEMV takes up to this many rows (0: cuBLAS for every linear)"},
    {"DEEPINFER_GEMV_PDL", "0|1", "1",
     "0: the small-M GEMV as a plain launch (a diagnostic, ~2.5 % slower)"},
    {"DEEPINFER_GEMV_RING", "0|2|3", "3 for one row of >= 4096 x 4096 (<= 64 MB), else 0",
     "stages of the small-M GEMV's cp.async ring (0: registers)"},
    {"DEEPINFER_GEMV_SPLIT", "0|1|2|4|8", "by grid fill (0: the same)",
     "warps per output row of the small-M GEMV (a power of two that fits the row)"},
    {"DEEPINFER_GPU_ARGMAX", "0|1", "1",
     "0: all-greedy batches go through the GPU sampler's sort too (A/B)"},
    {"DEEPINFER_GPU_SAMPLING", "0|1", "1", "0: sample on the host instead of the GPU"},
    {"DEEPINFER_GQA_DECODE_MMA", "-1|0|1", "-1: tensor cores for groups >= 4",
     "the tensor-core GQA decode kernel: 0 never, 1 for every group size"},
    {"DEEPINFER_GQA_HEAD_SPLIT", "0|1|2", "0: by the grid",
     "CUDA-core GQA decode: warps per kv head's q heads"},
    {"DEEPINFER_GQA_MMA_MERGE_WARP", "-1|0|1", "-1: where a CTA merges several splits",
     "the tensor-core GQA kernel's one-barrier warp merge: 0 never, 1 always (run 40)"},
    {"DEEPINFER_GQA_MMA_SPLITS_PER_CTA", "0|1..8", "0: by the grid",
     "tensor-core GQA decode: KV splits per CTA"},
    {"DEEPINFER_GQA_TOKEN_WARPS", "0|4|8", "0: by the grid",
     "CUDA-core GQA decode: warps per token"},
    {"DEEPINFER_GRAPH_STATS", "0|1", "0",
     "1: decode graphs log their node summary and time their replays"},
    {"DEEPINFER_HEAD_LINEAR", "cublas", "the few-token kernel (head_linear.cu)",
     "cublas: per-head linears (MLA W_UK / W_UV) on cuBLAS; also keeps W_UK out of the MLA "
     "prologue"},
    {"DEEPINFER_LOG", "trace|debug|info|warn|warning|err|error|critical|off", "info", "log level"},
    {"DEEPINFER_MLA_CLUSTER_MIN_BLOCKS", "2|3", "3",
     "the MLA cluster kernel's 16-row variant: CTAs per SM it is compiled for"},
    {"DEEPINFER_MLA_CLUSTER_SPLIT", "0|16..", "by batch (0: the same)",
     "MLA cluster decode: latent entries per split"},
    {"DEEPINFER_MLA_DEFER", "0|1", "1",
     "0: batch-1 MLA decode merges in the cluster kernel, W_UV in its own launch (run 22)"},
    {"DEEPINFER_MLA_FUSED_UK", "0|1", "1", "0: W_UK in its own launch after the MLA prologue"},
    {"DEEPINFER_MLA_HEAD_SPLIT", "0..", "0: by the batch (1 under DEEPINFER_BATCH_INVARIANT=1)",
     "generic MLA decode: head groups per sequence"},
    {"DEEPINFER_MLA_KERNEL", "0|tile|cluster|wide", "by batch and shape",
     "the MLA decode kernel (0: the generic one)"},
    {"DEEPINFER_MLA_MERGE", "v1|wide|split", "split from 48 parts, else wide",
     "the deferred MLA merge kernel (runs 22-24)"},
    {"DEEPINFER_MLA_MERGE_PUSH", "0|1", "1",
     "0: one token's MLA split-merge sums pulled by rank 0 after the barrier (run 43)"},
    {"DEEPINFER_MLA_SPLIT", "0|16..", "64 (0: the same)", "generic MLA decode: split size"},
    {"DEEPINFER_MLA_WIDE_MIN_TOKENS", "1..", "16",
     "the wide MLA decode kernel from this many tokens"},
    {"DEEPINFER_MLA_WIDE_SPLIT", "0..", "0: by the grid", "wide MLA decode: split size in tokens"},
    {"DEEPINFER_MLA_WIDE_WARPS", "0|4|8", "0: 4 from 128 tokens, else 8",
     "wide MLA decode: warps per CTA"},
    {"DEEPINFER_MODEL", "", "models/deepinfer-demo-code",
     "the model directory of commands run without --model"},
    {"DEEPINFER_MOE_DECODE", "v1|v2|tc", "tc",
     "the MoE decode expert kernels (v1, v2: the CUDA-core kernels; tc: tensor cores)"},
    {"DEEPINFER_MOE_DECODE_GROUPED_MIN_ROWS", "0..", "0: never",
     "MoE decode through the grouped GEMM from this many rows per touched expert"},
    {"DEEPINFER_MOE_FUSED", "0|1|route|residual", "1",
     "the MoE block's fused router and fused expert output: 0 neither, route / residual one"},
    {"DEEPINFER_MOE_ROUTE", "serial|warp", "warp",
     "the unfused MoE router: one warp per token, or one thread (serial)"},
    {"DEEPINFER_MOE_ROUTE_CLUSTER", "0|1", "1",
     "0: the fused router's arrival-counter kernel instead of the cluster router (run 26)"},
    {"DEEPINFER_MOE_ROUTE_ON_LOGITS", "0|1", "1",
     "0: the general routing formula on every backend instead of top-k on the logits"},
    {"DEEPINFER_MOE_ROUTE_SLOTS", "16", "by expert count",
     "16: the 16-slot router kernels for every expert count"},
    {"DEEPINFER_MOE_SHARED_EARLY", "0|1", "1",
     "0: the shared experts' gate_up after the router instead of during it"},
    {"DEEPINFER_MOE_T1", "0|1|off|on", "1",
     "0 / off: one-token MoE through the general decode kernels"},
    {"DEEPINFER_MOE_T1_DOWN", "v1|pipe|smem|slot", "by shape (slot, run 41)",
     "the one-token MoE down kernel"},
    {"DEEPINFER_MOE_T1_DOWN_EARLY", "0|1", "1",
     "0: the pipelined one-token down kernel loads its first rows after its wait"},
    {"DEEPINFER_MOE_T1_GU", "4x4|2x6|2x8", "2x6 when its grid fits one wave, else 4x4",
     "the one-token gate_up variant (loads per lane x CTAs per SM)"},
    {"DEEPINFER_MOE_T1_PDL", "0|1", "by path",
     "the one-token MoE kernels as PDL dependents (1) or plain launches (0)"},
    {"DEEPINFER_MOE_T1_SLOT_C", "0|1|2|4", "0: by rows (4, or 2)",
     "the slot down kernel's columns per CTA"},
    {"DEEPINFER_MOE_T1_TRIGGER", "0|1", "1",
     "0: the one-token down kernels let the next layer's kernel start only at their end, not "
     "at their start"},
    {"DEEPINFER_MOE_TC_STAGES", "3|4", "4", "the MoE tensor-core decode kernels' ring stages"},
    {"DEEPINFER_PDL", "0|1", "1", "0: no programmatic dependent launches anywhere"},
    {"DEEPINFER_PDL_DECODE", "0..15", "13",
     "decode kernels launched as PDL dependents, a bit mask: 1 rope/store, 2 CUDA-core GQA, "
     "4 split combine, 8 tensor-core GQA"},
    {"DEEPINFER_PINNED_DOWNLOAD", "0|1", "1",
     "0: device-to-host copies into fresh pageable memory instead of a pinned pool"},
    {"DEEPINFER_ROPE_STORE_WARP", "0|1", "1",
     "0: rope/store with a CTA per row instead of a warp per row (run 39)"},
    {"DEEPINFER_THREADS", "1..", "the hardware threads", "the CPU backend's thread pool size"},
};

bool parse_int(std::string_view s, long long& out) {
  if (s.empty()) return false;
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, out);
  return ec == std::errc() && p == end;
}

// Whether `value` matches one '|'-separated item: a literal, or an integer range "a..b" / "a..".
bool matches(std::string_view item, std::string_view value) {
  const size_t dots = item.find("..");
  if (dots == std::string_view::npos) return item == value;
  long long lo = 0, hi = 0, v = 0;
  if (!parse_int(item.substr(0, dots), lo) || !parse_int(value, v)) return false;
  const std::string_view upper = item.substr(dots + 2);
  if (!upper.empty() && (!parse_int(upper, hi) || v > hi)) return false;
  return v >= lo;
}

// Whether `pred` holds for one of the '|'-separated items of `values`.
template <typename Pred>
bool any_item(std::string_view values, Pred pred) {
  while (true) {
    const size_t bar = values.find('|');
    if (pred(values.substr(0, bar))) return true;
    if (bar == std::string_view::npos) return false;
    values.remove_prefix(bar + 1);
  }
}

// The table's entry of `name`; throws when it has none (a programming error).
const Variable& declared(const char* name) {
  const Variable* v = find(name);
  if (v == nullptr)
    throw Error(fmt::format("{} is read but not declared in core/env.cpp's table", name));
  return *v;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

Variables variables() {
  return {std::begin(kVariables), std::end(kVariables)};
}

const Variable* find(std::string_view name) {
  for (const Variable& v : kVariables)
    if (v.name == name) return &v;
  return nullptr;
}

std::optional<std::string> invalid(const Variable& v, std::string_view value) {
  if (v.values.empty() ||
      any_item(v.values, [&](std::string_view item) { return matches(item, value); }))
    return std::nullopt;
  return fmt::format("{}={}: expected {} (unset: {}; {})", v.name, value, v.values, v.unset,
                     v.help);
}

namespace {
// v's value (v is `name`'s entry); nullptr when unset or empty; throws when invalid.
const char* value_of(const Variable& v, const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return nullptr;
  if (auto why = invalid(v, value)) throw Error(*why);
  return value;
}
}  // namespace

const char* get(const char* name) {
  return value_of(declared(name), name);
}

bool is(const char* name, const char* value) {
  const Variable& v = declared(name);
  if (!any_item(v.values, [&](std::string_view item) { return item == value; }))
    throw Error(
        fmt::format("env::is({}, {}): not one of its declared values {}", name, value, v.values));
  const char* set = value_of(v, name);
  return set != nullptr && std::string_view(set) == value;
}

int get_int(const char* name, int unset) {
  const char* value = get(name);
  if (value == nullptr) return unset;
  long long out = 0;
  if (!parse_int(value, out) || out < -(1LL << 31) || out >= (1LL << 31))
    throw Error(fmt::format("{}={}: expected an integer", name, value));
  return static_cast<int>(out);
}

std::vector<Problem> check_environment() {
  std::vector<Problem> problems;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (!entry.starts_with(kPrefix)) continue;
    const size_t eq = entry.find('=');
    const std::string_view name = entry.substr(0, eq);
    const std::string_view value = eq == std::string_view::npos ? "" : entry.substr(eq + 1);
    if (const Variable* v = find(name)) {
      if (value.empty()) continue;
      if (auto why = invalid(*v, value)) problems.push_back({true, *why});
      continue;
    }
    const Variable* nearest = nullptr;
    size_t best = 4;  // suggest names within 3 edits
    for (const Variable& v : kVariables) {
      const size_t d = edit_distance(name, v.name);
      if (d < best) best = d, nearest = &v;
    }
    problems.push_back(
        {false,
         nearest != nullptr
             ? fmt::format("{} is not a deepinfer variable (did you mean {}?); "
                           "`deepinfer env` lists them",
                           name, nearest->name)
             : fmt::format("{} is not a deepinfer variable; `deepinfer env` lists them", name)});
  }
  return problems;
}

bool report_environment(const char* program) {
  bool ok = true;
  for (const Problem& p : check_environment()) {
    std::fprintf(stderr, "%s: %s: %s\n", program, p.fatal ? "error" : "warning", p.message.c_str());
    ok = ok && !p.fatal;
  }
  return ok;
}

std::vector<std::string> set_variables() {
  std::vector<std::string> out;
  for (const Variable& v : kVariables) {
    const std::string name(v.name);
    if (const char* value = std::getenv(name.c_str()); value != nullptr)
      out.push_back(name + "=" + value);
  }
  return out;
}

}  // namespace di::env
