#include "scheduler/scheduler.h"

#include <algorithm>
#include <unordered_map>

#include "core/error.h"

namespace di {

Scheduler::Scheduler(KvCacheManager& kv, SchedulerConfig config) : kv_(&kv), config_(config) {
  int32_t capacity = kv.num_blocks() * kv.block_size();
  if (config_.max_model_len == 0) config_.max_model_len = capacity;
  // One sequence alone must always fit, or preempting everything else would not make progress.
  DI_CHECK(config_.max_model_len > 1 && config_.max_model_len <= capacity,
           "max_model_len {} must be in [2, {}] (KV pool of {} blocks x {} tokens)",
           config_.max_model_len, capacity, kv.num_blocks(), kv.block_size());
}

Status Scheduler::add(RequestId id, std::vector<TokenId> prompt, RequestParams params) {
  if (prompt.empty()) return make_status(StatusCode::kInvalidArgument, "the prompt is empty");
  if (static_cast<int64_t>(prompt.size()) >= config_.max_model_len) {
    return make_status(StatusCode::kInvalidArgument,
                       "the prompt has {} tokens; the limit is {} including one output token",
                       prompt.size(), config_.max_model_len);
  }
  if (params.n < 1 || params.n > config_.limits.max_num_seqs) {
    return make_status(StatusCode::kInvalidArgument, "n must be in [1, {}], got {}",
                       config_.limits.max_num_seqs, params.n);
  }
  if (params.max_tokens < 1) {
    return make_status(StatusCode::kInvalidArgument, "max_tokens must be >= 1, got {}",
                       params.max_tokens);
  }
  if (num_live_seqs_.contains(id)) {
    return make_status(StatusCode::kAlreadyExists, "request {} is already running", id.value());
  }
  for (TokenId t : prompt) {
    if (t < 0) return make_status(StatusCode::kInvalidArgument, "negative token id {}", t);
  }
  Sequence s;
  s.seq_id = SeqId(next_seq_++);
  s.request_id = id;
  s.arrival = next_arrival_++;
  s.num_samples = params.n;
  s.block_hashes = kv_->hash_tokens(prompt, params.cache_salt);
  s.params = std::make_shared<const RequestParams>(std::move(params));
  s.prompt = std::make_shared<const std::vector<TokenId>>(std::move(prompt));
  SeqId seq_id = s.seq_id;
  queues_.seqs.emplace(seq_id, std::move(s));
  queues_.push_waiting(seq_id);
  num_live_seqs_[id] = 1;
  return Status::ok();
}

int32_t Scheduler::abort(RequestId id) {
  if (!num_live_seqs_.contains(id)) return 0;
  std::vector<SeqId> victims;
  for (const auto& [seq_id, s] : queues_.seqs) {
    if (s.request_id == id) victims.push_back(seq_id);
  }
  for (SeqId seq_id : victims) retire(seq_id, FinishReason::kAbort);
  return static_cast<int32_t>(victims.size());
}

void Scheduler::finish(SeqId seq, FinishReason reason) {
  DI_CHECK(reason != FinishReason::kNone, "finish of sequence {} without a reason", seq.value());
  retire(seq, reason);
}

SeqEvent Scheduler::retire(SeqId id, FinishReason reason) {
  Sequence& s = queues_.seq(id);
  SeqEvent ev{
      s.request_id,         id, s.sample_idx, 0, reason, s.num_prompt_tokens(), s.num_cached_tokens,
      s.num_output_tokens()};
  if (s.status == SeqStatus::kRunning) {
    kv_->free(id);
    queues_.running.erase(std::find(queues_.running.begin(), queues_.running.end(), id));
  } else {
    queues_.waiting.erase(std::find(queues_.waiting.begin(), queues_.waiting.end(), id));
  }
  if (--num_live_seqs_[s.request_id] == 0) num_live_seqs_.erase(s.request_id);
  queues_.seqs.erase(id);
  return ev;
}

void Scheduler::preempt(SeqId id) {
  Sequence& s = queues_.seq(id);
  // Recompute policy: the output so far becomes part of what is prefilled on resumption; the
  // blocks already computed stay in the prefix cache, so resumption usually hits most of them.
  auto hashes = kv_->block_hashes(id);
  s.block_hashes.assign(hashes.begin(), hashes.end());
  kv_->free(id);
  queues_.running.erase(std::find(queues_.running.begin(), queues_.running.end(), id));
  s.status = SeqStatus::kPreempted;
  ++s.num_preemptions;
  ++num_preemptions_;
  queues_.push_waiting(id);
}

void Scheduler::admit(SeqId id, int32_t expected_cached) {
  Sequence& s = queues_.seq(id);
  DI_CHECK(!queues_.waiting.empty() && queues_.waiting.front() == id,
           "admitted sequence {} is not at the head of the waiting queue", id.value());
  queues_.waiting.pop_front();
  int32_t cached = kv_->admit(id, s.tokens(), s.params->cache_salt, std::move(s.block_hashes));
  s.block_hashes.clear();
  DI_CHECK(cached == expected_cached, "sequence {}: planned {} cached tokens, admitted with {}",
           id.value(), expected_cached, cached);
  if (!s.was_admitted) s.num_cached_tokens = cached;
  s.was_admitted = true;
  s.status = SeqStatus::kRunning;
  queues_.running.push_back(id);
}

StepPlan Scheduler::step() {
  StepPlan plan;
  plan.schedule = schedule(queues_, KvBudget(*kv_), config_.limits);
  const ScheduleResult& r = plan.schedule;
  // Same order as the plan (kv_budget.h): free, reference hits, then allocate.
  for (SeqId id : r.preempted) preempt(id);
  size_t first_admitted = r.prefills.size() - r.admitted.size();
  for (size_t i = 0; i < r.admitted.size(); ++i) {
    admit(r.admitted[i], r.prefills[first_admitted + i].start);
  }
  for (const auto* list : {&r.decodes, &r.prefills}) {
    for (const ScheduledSeq& e : *list) {
      if (std::optional<BlockCopy> copy = kv_->allocate_slots(e.seq_id)) {
        plan.block_copies.push_back(*copy);
      }
    }
  }
  fill_inputs(plan);
  return plan;
}

void Scheduler::fill_inputs(StepPlan& plan) const {
  std::vector<PagedBatchEntry> entries;
  for (const auto* list : {&plan.schedule.decodes, &plan.schedule.prefills}) {
    for (const ScheduledSeq& e : *list) {
      std::span<const TokenId> tokens = kv_->tokens(e.seq_id);
      for (int32_t p = e.start; p < e.start + e.num_tokens; ++p) {
        plan.input_ids.push_back(tokens[p]);
        plan.positions.push_back(p);
      }
      entries.push_back({kv_->block_table(e.seq_id), e.start, e.num_tokens});
    }
  }
  plan.paged = build_paged_batch(entries, kv_->block_size());
}

std::vector<SeqEvent> Scheduler::update(const StepPlan& plan,
                                        std::span<const SampledTokens> sampled) {
  std::unordered_map<SeqId, const SampledTokens*> by_seq;
  for (const SampledTokens& st : sampled) by_seq.emplace(st.seq_id, &st);
  std::vector<SeqEvent> events;
  for (const auto* list : {&plan.schedule.decodes, &plan.schedule.prefills}) {
    for (const ScheduledSeq& e : *list) {
      auto found = by_seq.find(e.seq_id);
      if (!queues_.seqs.contains(e.seq_id)) continue;  // aborted or finished since step()
      DI_CHECK((found != by_seq.end()) == (e.num_samples > 0),
               "sequence {}: {} samples planned, sampled tokens {}given", e.seq_id.value(),
               e.num_samples, found != by_seq.end() ? "" : "not ");
      kv_->mark_computed(e.seq_id, e.start + e.num_tokens);
      if (e.num_samples == 0) continue;
      const std::vector<TokenId>& tokens = found->second->tokens;
      DI_CHECK(static_cast<int32_t>(tokens.size()) == e.num_samples,
               "sequence {}: {} tokens sampled, {} planned", e.seq_id.value(), tokens.size(),
               e.num_samples);
      // n > 1: the prompt is computed once; n - 1 siblings share its blocks from here on.
      std::vector<SeqId> group{e.seq_id};
      for (int32_t k = 1; k < e.num_samples; ++k) {
        Sequence child = queues_.seq(e.seq_id);
        child.seq_id = SeqId(next_seq_++);
        child.sample_idx = k;
        child.num_samples = 1;
        kv_->fork(e.seq_id, child.seq_id);
        queues_.running.push_back(child.seq_id);
        ++num_live_seqs_[child.request_id];
        group.push_back(child.seq_id);
        queues_.seqs.emplace(child.seq_id, std::move(child));
      }
      queues_.seq(e.seq_id).num_samples = 1;
      for (size_t k = 0; k < group.size(); ++k) {
        Sequence& s = queues_.seq(group[k]);
        TokenId token = tokens[k];
        s.output.push_back(token);
        kv_->append_token(s.seq_id, token);
        const RequestParams& p = *s.params;
        FinishReason reason = FinishReason::kNone;
        if (std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) !=
            p.stop_token_ids.end()) {
          reason = FinishReason::kStop;
        } else if (s.num_output_tokens() >= p.max_tokens ||
                   s.num_tokens() >= config_.max_model_len) {
          reason = FinishReason::kLength;
        }
        if (reason != FinishReason::kNone) {
          SeqEvent ev = retire(group[k], reason);
          ev.token = token;
          events.push_back(ev);
        } else {
          events.push_back({s.request_id, s.seq_id, s.sample_idx, token, FinishReason::kNone,
                            s.num_prompt_tokens(), s.num_cached_tokens, s.num_output_tokens()});
        }
      }
    }
  }
  return events;
}

void Scheduler::check_integrity() const {
  kv_->check_integrity();
  queues_.check_integrity(*kv_);
  std::unordered_map<RequestId, int32_t> counts;
  for (const auto& [id, s] : queues_.seqs) ++counts[s.request_id];
  DI_CHECK(counts == num_live_seqs_, "live-sequence counts per request are stale");
}

}  // namespace di
