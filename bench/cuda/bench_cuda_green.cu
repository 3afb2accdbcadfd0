// What a hand-off between two SM partitions costs (issue #6, run 36). The batch-1 ledger
// (docs/cuda_backend.md) points to a step whose latency-bound kernels run on a few SMs of their
// own while the weight streams run on the rest. With green contexts (CUDA 12.4+: an SM partition
// per context, a stream per partition) every hand-off between the parts is an event edge between
// streams instead of a PDL boundary (0.84 us, bench_cuda_launch). This measures the GPU side of
// such edges: a chain of N one-CTA kernels, each stamping %globaltimer and %smid, enqueued behind
// a gate kernel that spins on a host flag (so the host's enqueue rate does not count), then
// released; printed is (last stamp - first stamp) / (N - 1) per hand-off, and where the kernels
// ran.
//
//   [green] one-stream    every kernel on one stream (a plain kernel boundary)
//   [green] two-streams   alternating between two streams of the primary context, event edges
//   [green] green-one     every kernel on the small partition's stream
//   [green] green-two     alternating between the small and the large partition, event edges
// and each of them again as a CUDA graph (`graph ns_per_kernel`: the replay's time per kernel;
// added after run 36's device time was spent: not yet run).
//
//   bench_cuda_green [--small-sms 16] [--n 200]
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <vector>

namespace {

#define CK(x)                                                                                 \
  do {                                                                                        \
    const cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void tick(unsigned long long* ts, unsigned* sm, int i) {
  if (threadIdx.x != 0) return;
  unsigned s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  ts[i] = now_ns();
  sm[i] = s;
}

__global__ void gate(const volatile int* flag) {
  if (threadIdx.x == 0)
    while (*flag == 0) {
    }
}

// Driver entry points through the runtime (no link against libcuda).
template <typename F>
F driver(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion(name, &fn, CUDART_VERSION, cudaEnableDefault, &q) !=
          cudaSuccess ||
      q != cudaDriverEntryPointSuccess || fn == nullptr) {
    std::fprintf(stderr, "[green] driver entry point %s not found\n", name);
    return nullptr;
  }
  return reinterpret_cast<F>(fn);
}

struct Lane {
  cudaStream_t stream = nullptr;
  CUcontext ctx = nullptr;  // made current before enqueueing on `stream` (null: the primary)
};

struct Chain {
  unsigned long long* ts;
  unsigned* sm;
  int* flag;  // host-mapped
  int n;
};

using CtxSetCurrent = CUresult (*)(CUcontext);

// Makes a lane's context current (its green context, or the primary one) before work is
// enqueued on its stream or an event is made for it.
struct Contexts {
  CtxSetCurrent set_current;
  CUcontext primary;
  void use(const Lane& l) const {
    if (set_current != nullptr) set_current(l.ctx != nullptr ? l.ctx : primary);
  }
};

// The chain's events: event i in the context of the lane that records it (lane i mod lanes).
class ChainEvents {
 public:
  ChainEvents(const std::vector<Lane>& lanes, int n, const Contexts& cx)
      : lanes_(lanes), cx_(cx), events_(static_cast<size_t>(n)) {
    for (size_t i = 0; i < events_.size(); ++i) {
      cx_.use(lanes_[i % lanes_.size()]);
      CK(cudaEventCreateWithFlags(&events_[i], cudaEventDisableTiming));
    }
  }
  ~ChainEvents() {
    for (size_t i = 0; i < events_.size(); ++i) {
      cx_.use(lanes_[i % lanes_.size()]);
      CK(cudaEventDestroy(events_[i]));
    }
  }
  ChainEvents(const ChainEvents&) = delete;
  ChainEvents& operator=(const ChainEvents&) = delete;
  cudaEvent_t operator[](int i) const { return events_[static_cast<size_t>(i)]; }

 private:
  const std::vector<Lane>& lanes_;
  Contexts cx_;
  std::vector<cudaEvent_t> events_;
};

// Enqueues gate + n ticks alternating over `lanes` (event edges between lanes), releases the
// gate, and prints one run's mean and largest hand-off and the SMs used per lane.
void run_chain(const char* name, const std::vector<Lane>& lanes, const Chain& c,
               const Contexts& cx) {
  auto use = [&](const Lane& l) { cx.use(l); };
  const ChainEvents events(lanes, c.n, cx);
  *const_cast<volatile int*>(c.flag) = 0;
  int* d_flag = nullptr;
  CK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&d_flag), c.flag, 0));
  use(lanes[0]);
  gate<<<1, 32, 0, lanes[0].stream>>>(d_flag);
  CK(cudaGetLastError());
  for (int i = 0; i < c.n; ++i) {
    const Lane& l = lanes[static_cast<size_t>(i) % lanes.size()];
    use(l);
    if (i > 0 && lanes.size() > 1) CK(cudaStreamWaitEvent(l.stream, events[i - 1], 0));
    tick<<<1, 32, 0, l.stream>>>(c.ts, c.sm, i);
    CK(cudaGetLastError());
    if (lanes.size() > 1) CK(cudaEventRecord(events[i], l.stream));
  }
  *const_cast<volatile int*>(c.flag) = 1;
  for (const Lane& l : lanes) {
    use(l);
    CK(cudaStreamSynchronize(l.stream));
  }
  std::vector<unsigned long long> ts(static_cast<size_t>(c.n));
  std::vector<unsigned> sm(static_cast<size_t>(c.n));
  use(lanes[0]);
  CK(cudaMemcpy(ts.data(), c.ts, ts.size() * 8, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(sm.data(), c.sm, sm.size() * 4, cudaMemcpyDeviceToHost));
  // Skip the first 10 (the gate's release), then the per-hand-off mean and the largest gap.
  const int first = 10;
  const double per = static_cast<double>(ts[static_cast<size_t>(c.n) - 1] - ts[first]) /
                     static_cast<double>(c.n - 1 - first);
  unsigned long long worst = 0;
  for (int i = first + 1; i < c.n; ++i)
    worst = std::max(worst, ts[static_cast<size_t>(i)] - ts[static_cast<size_t>(i) - 1]);
  std::printf("[green] %-12s ns_per_handoff=%.0f worst=%llu", name, per, worst);
  for (size_t k = 0; k < lanes.size(); ++k) {
    std::set<unsigned> used;
    unsigned lo = ~0u, hi = 0;
    for (int i = static_cast<int>(k); i < c.n; i += static_cast<int>(lanes.size())) {
      used.insert(sm[static_cast<size_t>(i)]);
      lo = std::min(lo, sm[static_cast<size_t>(i)]);
      hi = std::max(hi, sm[static_cast<size_t>(i)]);
    }
    std::printf(" lane%zu_sms=%zu(%u-%u)", k, used.size(), lo, hi);
  }
  std::printf("\n");
}

// The same chain captured into a CUDA graph (stream capture forked across the lanes by events,
// joined back into lanes[0]) and replayed: the per-kernel time of a replay, as a decode step
// would pay it. Prints the capture's error instead when a lane's context cannot join it.
void run_graph(const char* name, const std::vector<Lane>& lanes, const Chain& c,
               const Contexts& cx) {
  auto use = [&](const Lane& l) { cx.use(l); };
  const ChainEvents events(lanes, c.n, cx);
  use(lanes[0]);
  cudaError_t err = cudaStreamBeginCapture(lanes[0].stream, cudaStreamCaptureModeRelaxed);
  for (int i = 0; i < c.n && err == cudaSuccess; ++i) {
    const Lane& l = lanes[static_cast<size_t>(i) % lanes.size()];
    use(l);
    if (i > 0 && lanes.size() > 1) err = cudaStreamWaitEvent(l.stream, events[i - 1], 0);
    if (err != cudaSuccess) break;
    tick<<<1, 32, 0, l.stream>>>(c.ts, c.sm, i);
    err = cudaGetLastError();
    if (err == cudaSuccess && lanes.size() > 1) err = cudaEventRecord(events[i], l.stream);
  }
  // Join: the last kernel's lane back into lanes[0].
  if (err == cudaSuccess && lanes.size() > 1 && (c.n - 1) % static_cast<int>(lanes.size()) != 0) {
    use(lanes[0]);
    err = cudaStreamWaitEvent(lanes[0].stream, events[c.n - 1], 0);
  }
  use(lanes[0]);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(lanes[0].stream, &graph);
  if (err == cudaSuccess) err = end;
  cudaGraphExec_t exec = nullptr;
  if (err == cudaSuccess) err = cudaGraphInstantiate(&exec, graph, 0);
  if (err != cudaSuccess) {
    std::printf("[green] %-12s graph: %s\n", name, cudaGetErrorString(err));
    (void)cudaGetLastError();
  } else {
    cudaEvent_t t0, t1;
    CK(cudaEventCreate(&t0));
    CK(cudaEventCreate(&t1));
    std::vector<float> ms;
    for (int rep = 0; rep < 21; ++rep) {
      CK(cudaEventRecord(t0, lanes[0].stream));
      CK(cudaGraphLaunch(exec, lanes[0].stream));
      CK(cudaEventRecord(t1, lanes[0].stream));
      CK(cudaEventSynchronize(t1));
      float m = 0.0f;
      CK(cudaEventElapsedTime(&m, t0, t1));
      if (rep > 0) ms.push_back(m);  // the first replay uploads the graph
    }
    std::sort(ms.begin(), ms.end());
    std::printf("[green] %-12s graph ns_per_kernel=%.0f (median of 20 replays of %d kernels)\n",
                name, static_cast<double>(ms[ms.size() / 2]) * 1e6 / c.n, c.n);
    CK(cudaEventDestroy(t0));
    CK(cudaEventDestroy(t1));
    CK(cudaGraphExecDestroy(exec));
  }
  if (graph != nullptr) CK(cudaGraphDestroy(graph));
}

}  // namespace

int main(int argc, char** argv) {
  int small_sms = 16, n = 200;
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--small-sms")) small_sms = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--n")) n = std::max(20, std::atoi(argv[++i]));
  }
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));  // the primary context
  Chain c{};
  c.n = n;
  CK(cudaMalloc(&c.ts, static_cast<size_t>(n) * 8));
  CK(cudaMalloc(&c.sm, static_cast<size_t>(n) * 4));
  CK(cudaHostAlloc(reinterpret_cast<void**>(&c.flag), sizeof(int), cudaHostAllocMapped));
  auto get_current = driver<CUresult (*)(CUcontext*)>("cuCtxGetCurrent");
  auto set_current = driver<CtxSetCurrent>("cuCtxSetCurrent");
  CUcontext primary = nullptr;
  if (get_current != nullptr) get_current(&primary);
  const Contexts cx{set_current, primary};

  cudaStream_t s0 = nullptr, s1 = nullptr;
  CK(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  for (int rep = 0; rep < 2; ++rep) {
    run_chain("one-stream", {Lane{s0, nullptr}}, c, cx);
    run_chain("two-streams", {Lane{s0, nullptr}, Lane{s1, nullptr}}, c, cx);
  }
  run_graph("one-stream", {Lane{s0, nullptr}}, c, cx);
  run_graph("two-streams", {Lane{s0, nullptr}, Lane{s1, nullptr}}, c, cx);

  // Green contexts: `small_sms` SMs and the rest.
  auto get_resource =
      driver<CUresult (*)(CUdevice, CUdevResource*, CUdevResourceType)>("cuDeviceGetDevResource");
  auto split = driver<CUresult (*)(CUdevResource*, unsigned*, const CUdevResource*, CUdevResource*,
                                   unsigned, unsigned)>("cuDevSmResourceSplitByCount");
  auto gen_desc = driver<CUresult (*)(CUdevResourceDesc*, CUdevResource*, unsigned)>(
      "cuDevResourceGenerateDesc");
  auto green_create =
      driver<CUresult (*)(CUgreenCtx*, CUdevResourceDesc, CUdevice, unsigned)>("cuGreenCtxCreate");
  auto green_stream =
      driver<CUresult (*)(CUstream*, CUgreenCtx, unsigned, int)>("cuGreenCtxStreamCreate");
  auto ctx_from_green = driver<CUresult (*)(CUcontext*, CUgreenCtx)>("cuCtxFromGreenCtx");
  if (!get_resource || !split || !gen_desc || !green_create || !green_stream || !ctx_from_green ||
      !set_current) {
    std::printf("[green] green contexts unavailable: no green rows\n");
    return 0;
  }
  CUdevResource all{}, small{}, rest{};
  CUresult r = get_resource(0, &all, CU_DEV_RESOURCE_TYPE_SM);
  unsigned groups = 1;
  if (r == CUDA_SUCCESS)
    r = split(&small, &groups, &all, &rest, 0, static_cast<unsigned>(small_sms));
  if (r != CUDA_SUCCESS || groups != 1) {
    std::printf("[green] SM split failed (CUresult %d, groups %u)\n", static_cast<int>(r), groups);
    return 0;
  }
  std::printf("[green] partitions: small %u SMs, rest %u SMs (device %u)\n", small.sm.smCount,
              rest.sm.smCount, all.sm.smCount);
  CUdevResourceDesc d_small{}, d_rest{};
  CUgreenCtx g_small = nullptr, g_rest = nullptr;
  CUstream gs = nullptr, gr = nullptr;
  CUcontext c_small = nullptr, c_rest = nullptr;
  r = gen_desc(&d_small, &small, 1);
  if (r == CUDA_SUCCESS) r = gen_desc(&d_rest, &rest, 1);
  if (r == CUDA_SUCCESS) r = green_create(&g_small, d_small, 0, CU_GREEN_CTX_DEFAULT_STREAM);
  if (r == CUDA_SUCCESS) r = green_create(&g_rest, d_rest, 0, CU_GREEN_CTX_DEFAULT_STREAM);
  if (r == CUDA_SUCCESS) r = green_stream(&gs, g_small, CU_STREAM_NON_BLOCKING, 0);
  if (r == CUDA_SUCCESS) r = green_stream(&gr, g_rest, CU_STREAM_NON_BLOCKING, 0);
  if (r == CUDA_SUCCESS) r = ctx_from_green(&c_small, g_small);
  if (r == CUDA_SUCCESS) r = ctx_from_green(&c_rest, g_rest);
  if (r != CUDA_SUCCESS) {
    std::printf("[green] green context setup failed (CUresult %d)\n", static_cast<int>(r));
    return 0;
  }
  for (int rep = 0; rep < 2; ++rep) {
    run_chain("green-one", {Lane{gs, c_small}}, c, cx);
    run_chain("green-two", {Lane{gs, c_small}, Lane{gr, c_rest}}, c, cx);
  }
  run_graph("green-one", {Lane{gs, c_small}}, c, cx);
  run_graph("green-two", {Lane{gs, c_small}, Lane{gr, c_rest}}, c, cx);
  return 0;
}
