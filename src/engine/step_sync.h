#pragma once
// StepSync: what an EngineLoop that is one rank of a DP group (dp_engine_group.h) asks the group
// once per loop iteration. Every MoE layer of an expert-parallel model is a collective, so the
// ranks must run their forwards in lockstep: one group step = one forward on every rank.
//
//   rank thread:  drain inbox ─► apply messages ─► arrive(has_work, stopping) ─► decision
//                                                   (blocks until every rank arrived)
//     decision.stop  ─► end every open request (kAbort) and exit the thread
//     decision.step  ─► a real step if this rank has work, else a padding step (one token, no KV)
//     neither        ─► idle: wait on the inbox until mail, stop, or wake() from the group
//
// The decision is the same for every rank of a round. A standalone engine has no StepSync.
#include <cstdint>
#include <string>

namespace di {

// What a rank brings to the group's per-step agreement on the decode exchange (after it
// scheduled its step): every rank of a step must run the same collectives with the same sizes,
// so a plain decode step on every rank runs the latency exchange with one agreed row count (and,
// on CUDA, replays step graphs of one agreed (bucket, context) key); anything else runs the
// throughput exchange.
//
// The same round also agrees on the step's EPLB phase (eplb_runtime.h): a group step is a prefill
// step when any rank's step has a prompt token, so every rank counts it in the same phase.
struct DecodeShape {
  int32_t rows = -1;       // sequences of a plain decode step; 0 for a padding step; -1 otherwise
  int32_t max_blocks = 0;  // KV blocks of this rank's longest sequence in the step
  bool prefill = false;    // in: this rank's step has a prompt token; out: some rank's has
  bool failed = false;     // out: no agreement (a rank's step failed; rows -1): the step fails
  // in: EPLB steps this rank closed so far (-1 without EPLB); out: the same value when every rank
  // brought it, else kEplbStepsDiffer (the ranks would meet at different load all-reduces and
  // hang: the step fails on every rank instead).
  int64_t eplb_steps = -1;
  static constexpr int64_t kEplbStepsDiffer = -2;
};

struct GroupDecision {
  bool step = false;  // some rank has work: every rank runs a forward this iteration
  bool stop = false;  // some rank is stopping: every rank ends its requests and exits
};

class StepSync {
 public:
  virtual ~StepSync() = default;
  // Called with no engine lock held. Blocks until every rank of the group arrived.
  virtual GroupDecision arrive(int32_t rank_idx, bool has_work, bool stopping) = 0;
  // Called once per step by every rank, between arrive() and its forward. Returns rows = the max
  // over ranks and max_blocks = the max over ranks when every rank brought rows >= 0, else
  // rows = -1; prefill = any rank's. Blocks until every rank arrived (or a rank's step failed:
  // then failed = true, rows = -1, on every rank of the round).
  virtual DecodeShape agree_decode(int32_t rank_idx, DecodeShape mine) = 0;
  // This rank's step threw (a bug, not bad input): ranks waiting for it inside a collective of
  // the same step must be released (their step fails too).
  virtual void step_failed(int32_t rank_idx, const std::string& what) = 0;
};

}  // namespace di
