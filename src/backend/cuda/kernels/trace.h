#pragma once
// A timeline of the decode kernels' CTAs (a diagnostic build, -DDI_TRACE=1): each instrumented
// kernel's thread 0 records, per CTA, when it started, when its griddepcontrol.wait returned
// (0: the kernel did not wait), optionally one mark inside it (DI_TRACE_MARK: a phase the kernel
// names, e.g. its inputs loaded; 0: none) and when it ended, on the GPU's nanosecond timer
// (%globaltimer, comparable across SMs). bench_cuda_model --trace writes one replayed decode step
// of them, and scripts/trace_layers.py turns that into a per-layer timeline. In a normal build
// (DI_TRACE unset or 0) the kernels carry no tracing code and trace_enable() returns false.
// Host-includable.
#include <cstdint>
#include <vector>

namespace di::cuda {

// What an event's `site` names (the instrumented kernels).
enum TraceSite : uint32_t {
  kTraceGemv = 1,  // tag = output rows n
  kTraceQkvRopeStore = 2,
  kTraceGqaDecodeMma = 3,
  kTraceCombineSplits = 4,  // tag 0 = GQA, 1 = MLA (the older split path)
  kTraceMoeNormRoute = 5,
  kTraceMoeGateUpT1 = 6,
  kTraceMoeDownT1 = 7,  // tag 0 = pipelined, 1 = act in shared memory, 2 = slot split
  kTraceMlaRopeStore = 8,
  kTraceMlaClusterDecode = 9,
  kTraceMlaMergeUv = 10,
  kTraceArgmax = 11,
  // 12, 13: attn_o_proj and moe_t1_fused, removed in run 46 (scripts/trace_layers.py still
  // names them for the earlier runs' traces).
};

struct TraceEvent {
  uint32_t site = 0;
  uint32_t tag = 0;
  uint32_t cta = 0;  // linear block index
  uint32_t smid = 0;
  uint64_t t_start = 0, t_wait = 0, t_end = 0;  // ns
  uint64_t t_mark = 0;                          // ns (0: no mark)
};

// Where the kernels write (device pointers); every translation unit that includes common.cuh in
// a DI_TRACE build registers a setter for its own copy of the target.
struct TraceTarget {
  TraceEvent* events = nullptr;
  uint32_t* count = nullptr;
  uint32_t capacity = 0;
};
void trace_register_setter(void (*setter)(const TraceTarget&));

// Starts recording into a device buffer of `capacity` events (false when built without
// DI_TRACE, or on a CUDA error); trace_read() stops recording and returns the events in the
// order their CTAs started recording (sort by t_start for the timeline), at most capacity.
bool trace_enable(uint32_t capacity);
std::vector<TraceEvent> trace_read();

}  // namespace di::cuda
