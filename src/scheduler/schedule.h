#pragma once
// schedule(): what runs in the next step, as a pure function of the queues, a KV budget and limits.
// It mutates nothing; Scheduler::step() applies the result to the queues and the KV manager.
//
//   running (by urgency) ──► 1. decodes: 1 token each; a decode that needs a block and finds none
//                               preempts the least urgent running sequence (possibly itself)
//                          ──► 2. running prefills: next chunk, up to the token budget
//   waiting (by urgency) ──► 3. admissions, FCFS: prefix hit, blocks for the whole prompt, first
//                               chunk; stops at the first that does not fit; none after preemption
//
// Urgency = (priority, arrival, sample_idx), smaller first. Chunked prefill: a chunk covers tokens
// [start, start + num_tokens) of prompt ++ output; the chunk that reaches the end samples.
#include <cstdint>
#include <vector>

#include "kv/kv_budget.h"
#include "scheduler/queues.h"

namespace di {

struct Limits {
  int32_t max_num_batched_tokens = 8192;  // tokens computed per step, decodes included
  int32_t max_num_seqs = 256;             // running sequences (an unforked group counts n)
};

struct ScheduledSeq {
  SeqId seq_id;
  int32_t start = 0;        // = computed tokens before the step (the prefix-cache hit if admitted)
  int32_t num_tokens = 0;   // tokens [start, start + num_tokens) are computed in this step
  int32_t num_samples = 0;  // tokens to sample at the last position: 0 for a non-final chunk
};

struct ScheduleResult {
  std::vector<ScheduledSeq> decodes;   // num_tokens == 1, most urgent first
  std::vector<ScheduledSeq> prefills;  // chunks of running sequences, then of admitted ones
  std::vector<SeqId> admitted;         // waiting -> running; their chunks are in `prefills`
  std::vector<SeqId> preempted;        // running -> waiting; their blocks are freed
  std::vector<SeqId> waiting;          // still waiting (queue order), preempted ones not included
  int32_t num_batched_tokens = 0;

  bool empty() const { return decodes.empty() && prefills.empty(); }
};

ScheduleResult schedule(const Queues& queues, const KvBudget& budget, const Limits& limits);

}  // namespace di
