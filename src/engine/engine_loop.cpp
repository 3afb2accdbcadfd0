#include "engine/engine_loop.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <limits>
#include <map>
#include <span>
#include <utility>

#include "core/error.h"
#include "core/logging.h"
#include "engine/dp_engine_group.h"
#include "engine/sample_placement.h"
#include "model/config.h"
#include "model/weight_loader.h"
#include "sampling/sampler.h"

namespace di {
namespace {

uint64_t micros(std::chrono::steady_clock::duration d) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(d).count());
}

EngineFinish to_engine_finish(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return EngineFinish::kNone;
    case FinishReason::kStop:
      return EngineFinish::kStop;
    case FinishReason::kLength:
      return EngineFinish::kLength;
    case FinishReason::kAbort:
      return EngineFinish::kAbort;
  }
  return EngineFinish::kError;
}

int severity(EngineFinish f) {
  return f == EngineFinish::kError ? 2 : f == EngineFinish::kAbort ? 1 : 0;
}

}  // namespace

uint64_t sample_seed(uint64_t seed, int32_t sample_idx) {
  if (sample_idx == 0) return seed;
  // splitmix64 of (seed, sample_idx): a bijection of the sum, so distinct samples of one seed
  // never share a key.
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(sample_idx);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

Result<EngineParts> load_engine_parts(const EngineConfig& config) {
  auto bad = [](std::string message) {
    return Status(StatusCode::kInvalidArgument, std::move(message));
  };
  if (config.block_size < 1)
    return bad(fmt::format("block_size must be >= 1, got {}", config.block_size));
  if (config.num_blocks < 0)
    return bad(fmt::format("num_blocks must be >= 0, got {}", config.num_blocks));
  if (config.num_blocks == 0 && config.kv_cache_bytes <= 0) {
    return bad(fmt::format("kv_cache_bytes must be > 0 when num_blocks is 0, got {}",
                           config.kv_cache_bytes));
  }
  if (config.max_batched_tokens < 1 || config.max_running < 1 || config.max_model_len < 0) {
    return bad(
        fmt::format("max_batched_tokens ({}) and max_running ({}) must be >= 1 and "
                    "max_model_len ({}) >= 0",
                    config.max_batched_tokens, config.max_running, config.max_model_len));
  }
  if (config.eplb.enabled) {
    try {
      config.eplb.validate();
    } catch (const std::exception& e) {
      return bad(fmt::format("EPLB options: {}", e.what()));
    }
  }
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  try {
    backend = make_backend(config.backend);
    if (config.random_weights) {
      Result<ModelConfig> mc = load_model_config(config.model_dir);
      if (!mc.is_ok()) return mc.status();
      RandomWeights random;
      random.seed = config.random_seed;
      Tensor probe = backend->empty({8}, backend->compute_dtype());
      if (backend->fill_uniform(probe, 0, 1.0f)) {  // on the device; else host values, uploaded
        Backend* be = backend.get();
        random.fill = [be](Tensor& t, uint64_t seed, float scale) {
          DI_CHECK(be->fill_uniform(t, seed, scale), "fill_uniform refused {}", t.describe());
        };
      }
      model = make_random_model(mc.value(), *backend, random, {});
      DI_LOG_INFO("model {}: random weights (seed {}), not the checkpoint", config.model_dir,
                  config.random_seed);
    } else {
      model = load_model(config.model_dir, *backend, {});
    }
  } catch (const std::exception& e) {
    return bad(fmt::format("cannot load the model from '{}' on backend '{}': {}", config.model_dir,
                           config.backend, e.what()));
  }
  const int64_t block_bytes = kv_block_bytes(*model, *backend, config.block_size);
  const int64_t num_blocks =
      config.num_blocks > 0 ? config.num_blocks : config.kv_cache_bytes / block_bytes;
  if (num_blocks < 1 || num_blocks > std::numeric_limits<int32_t>::max()) {
    return Status(StatusCode::kResourceExhausted,
                  fmt::format("kv_cache_bytes {} holds {} blocks of {} bytes ({} tokens)",
                              config.kv_cache_bytes, num_blocks, block_bytes, config.block_size));
  }
  // The pool is allocated as the engine starts: refuse what cannot fit, with the numbers,
  // rather than fail inside the allocator.
  const int64_t pool_bytes = num_blocks * block_bytes;
  const int64_t available = backend->available_memory_bytes();
  if (available >= 0 && pool_bytes > available) {
    return Status(
        StatusCode::kResourceExhausted,
        fmt::format("the KV cache pool ({} blocks of {} tokens, {:.2f} GB) does not fit: {:.2f} GB "
                    "is available on the {} backend after loading the model; lower --kv-cache-mb",
                    num_blocks, config.block_size, static_cast<double>(pool_bytes) / 1e9,
                    static_cast<double>(available) / 1e9, backend->name()));
  }
  const int64_t capacity = num_blocks * config.block_size;
  const int64_t model_max = model->max_context();
  int64_t max_len = config.max_model_len > 0 ? config.max_model_len : std::min(model_max, capacity);
  if (max_len > model_max || max_len > capacity || max_len < 2) {
    return bad(
        fmt::format("max_model_len {} must be in [2, min(model context {}, KV pool {} = "
                    "{} blocks x {} tokens)]",
                    max_len, model_max, capacity, num_blocks, config.block_size));
  }
  EngineParts parts;
  parts.backend = std::move(backend);
  parts.model = std::move(model);
  parts.num_blocks = static_cast<int32_t>(num_blocks);
  parts.max_model_len = static_cast<int32_t>(max_len);
  return parts;
}

Result<std::unique_ptr<Engine>> Engine::start(const EngineConfig& config) {
  if (config.dp_size != 0) return DpEngineGroup::start(config);
  Result<EngineParts> parts = load_engine_parts(config);
  if (!parts.is_ok()) return parts.status();
  EngineParts& p = parts.value();
  try {
    return std::unique_ptr<Engine>(new EngineLoop(config, std::move(p.backend), std::move(p.model),
                                                  p.num_blocks, p.max_model_len));
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, fmt::format("cannot start the engine: {}", e.what()));
  }
}

EngineLoop::EngineLoop(const EngineConfig& config, std::unique_ptr<Backend> backend,
                       std::unique_ptr<Model> model, int32_t num_blocks, int32_t max_model_len,
                       EngineLoopHooks hooks)
    : config_(config),
      max_model_len_(max_model_len),
      hooks_(hooks),
      backend_(std::move(backend)),
      model_(std::move(model)),
      device_sampling_(config.device_sampling && device_sampling_allowed_by_env()) {
  runner_ = std::make_unique<ModelRunner>(*model_, *backend_, num_blocks, config_.block_size);
  if (hooks_.sample_threads > 0) sample_pool_ = std::make_unique<ThreadPool>(hooks_.sample_threads);
  if (config_.decode_graphs) runner_->enable_decode_graphs(config_.max_running, max_model_len_);
  if (config_.eplb.enabled) {
    eplb_ = std::make_unique<EplbRuntime>(*model_, *backend_, config_.eplb, hooks_.eplb_loads,
                                          hooks_.rank_idx);
  }
  KvCacheConfig kv_config;
  kv_config.num_blocks = num_blocks;
  kv_config.block_size = config_.block_size;
  kv_config.model_id = config_.model_dir;
  kv_config.enable_prefix_caching = config_.enable_prefix_caching;
  kv_ = std::make_unique<KvCacheManager>(kv_config);
  SchedulerConfig sched_config;
  sched_config.limits.max_num_batched_tokens = config_.max_batched_tokens;
  sched_config.limits.max_num_seqs = config_.max_running;
  sched_config.max_model_len = max_model_len_;
  scheduler_ = std::make_unique<Scheduler>(*kv_, sched_config);
  publish_stats();
  thread_ = std::thread([this] { run(); });
}

EngineLoop::~EngineLoop() {
  {
    std::lock_guard lock(inbox_mu_);
    stop_ = true;
  }
  inbox_cv_.notify_one();
  thread_.join();
}

Status EngineLoop::validate(const EngineRequest& r) const {
  auto bad = [](std::string message) {
    return Status(StatusCode::kInvalidArgument, std::move(message));
  };
  if (r.prompt.empty()) return bad("the prompt is empty");
  const int64_t vocab = vocab_size();
  for (size_t i = 0; i < r.prompt.size(); ++i) {
    if (r.prompt[i] < 0 || r.prompt[i] >= vocab) {
      return bad(fmt::format("prompt token {} at index {} is outside the vocabulary [0, {})",
                             r.prompt[i], i, vocab));
    }
  }
  if (r.max_tokens < 1) return bad(fmt::format("max_tokens must be >= 1, got {}", r.max_tokens));
  if (r.dp_rank != -1 && r.dp_rank != hooks_.rank_idx) {
    return bad(fmt::format("dp_rank {} is not this engine's rank ({}; -1 for any)", r.dp_rank,
                           hooks_.rank_idx));
  }
  if (r.n < 1 || r.n > config_.max_running) {
    return bad(fmt::format("n must be in [1, {}], got {}", config_.max_running, r.n));
  }
  const int64_t total = static_cast<int64_t>(r.prompt.size()) + r.max_tokens;
  if (total > max_model_len_) {
    return bad(
        fmt::format("the prompt ({} tokens) plus max_tokens ({}) is {}, over the model "
                    "length limit of {}",
                    r.prompt.size(), r.max_tokens, total, max_model_len_));
  }
  return r.sampling.validate();
}

Status EngineLoop::submit(EngineRequest request, TokenSink sink) {
  if (!sink) return Status(StatusCode::kInvalidArgument, "the token sink is empty");
  DI_RETURN_IF_ERROR(validate(request));
  {
    std::lock_guard lock(inbox_mu_);
    if (stop_) return Status(StatusCode::kUnavailable, "the engine is shutting down");
    if (!live_ids_.insert(request.id).second) {
      return make_status(StatusCode::kAlreadyExists, "request {} is already running",
                         request.id.value());
    }
    inbox_.emplace_back(SubmitMsg{std::move(request), std::move(sink)});
  }
  inbox_cv_.notify_one();
  return Status::ok();
}

void EngineLoop::abort(RequestId id) {
  {
    std::lock_guard lock(inbox_mu_);
    inbox_.emplace_back(AbortMsg{id});
  }
  inbox_cv_.notify_one();
}

void EngineLoop::finish(RequestId id) {
  {
    std::lock_guard lock(inbox_mu_);
    inbox_.emplace_back(FinishMsg{id});
  }
  inbox_cv_.notify_one();
}

void EngineLoop::wake() {
  {
    std::lock_guard lock(inbox_mu_);
    wake_ = true;
  }
  inbox_cv_.notify_one();
}

std::vector<RequestId> EngineLoop::live_request_ids() const {
  std::lock_guard lock(inbox_mu_);
  return {live_ids_.begin(), live_ids_.end()};
}

EngineStats EngineLoop::stats() const {
  std::lock_guard lock(stats_mu_);
  return stats_;
}

void EngineLoop::run() {
  StepSync* const sync = hooks_.sync;
  if (hooks_.bind_thread) hooks_.bind_thread(hooks_.rank_idx);
  // Standalone: requests are in flight. Group rank: the group stepped in the last round, so this
  // rank comes to the next barrier without waiting for mail.
  bool busy = false;
  while (true) {
    std::vector<Message> messages;
    bool stopping = false;
    {
      std::unique_lock lock(inbox_mu_);
      inbox_cv_.wait(lock, [&] { return stop_ || busy || wake_ || !inbox_.empty(); });
      wake_ = false;
      messages.swap(inbox_);
      stopping = stop_;
    }
    Outbox out;
    bool has_work = false;
    {
      std::lock_guard state(state_mu_);
      for (Message& m : messages) handle(m, out);
      has_work = !stopping && scheduler_->has_unfinished();
    }
    // The group's barrier, with no lock held (submitters, stats and check_integrity stay live).
    GroupDecision group{.step = has_work, .stop = stopping};
    if (sync != nullptr) {
      const auto t0 = std::chrono::steady_clock::now();
      group = sync->arrive(hooks_.rank_idx, has_work, stopping);
      // Only a step round's wait is counted (an idle group waits here for mail).
      if (group.step) counters_.group_wait_us += micros(std::chrono::steady_clock::now() - t0);
    }
    {
      std::lock_guard state(state_mu_);
      if (group.stop) {
        if (!stopping) {
          // Another rank stops the group: refuse new mail, apply what came since the drain.
          std::vector<Message> late;
          {
            std::lock_guard lock(inbox_mu_);
            stop_ = true;
            late.swap(inbox_);
          }
          for (Message& m : late) handle(m, out);
          stopping = true;
        }
        end_all(EngineFinish::kAbort, "", out);
      } else if (group.step) {
        try {
          if (scheduler_->has_unfinished()) {
            run_step(out);
          } else {
            run_padding_step();
          }
        } catch (const std::exception& e) {
          // Nothing already sampled is lost: those events are in `out`. Everything in flight
          // fails with the message; the engine keeps serving new requests.
          DI_LOG_ERROR("engine step {} failed: {}", counters_.steps, e.what());
          if (sync != nullptr) sync->step_failed(hooks_.rank_idx, e.what());
          end_all(EngineFinish::kError, fmt::format("engine step failed: {}", e.what()), out);
          end_failed_eplb_step();
        }
      }
      busy = sync != nullptr ? group.step : scheduler_->has_unfinished();
      if (!closed_.empty()) {
        std::lock_guard lock(inbox_mu_);
        for (RequestId id : closed_) {
          requests_.erase(id);
          live_ids_.erase(id);
        }
        closed_.clear();
      }
#ifndef NDEBUG
      scheduler_->check_integrity();
#endif
      publish_stats();
    }
    deliver(out);
    if (stopping) return;
  }
}

void EngineLoop::handle(Message& msg, Outbox& out) {
  if (auto* s = std::get_if<SubmitMsg>(&msg)) {
    handle_submit(*s, out);
  } else if (auto* a = std::get_if<AbortMsg>(&msg)) {
    end_request(a->id, EngineFinish::kAbort, "", out);
  } else if (auto* f = std::get_if<FinishMsg>(&msg)) {
    end_request(f->id, EngineFinish::kStop, "", out);
  }
}

void EngineLoop::handle_submit(SubmitMsg& msg, Outbox& out) {
  EngineRequest& req = msg.request;
  const RequestId id = req.id;
  RequestState r;
  r.sink = std::make_shared<const TokenSink>(std::move(msg.sink));
  r.num_open = req.n;
  r.sample_done.assign(static_cast<size_t>(req.n), 0);
  for (int32_t k = 0; k < req.n; ++k) {
    SamplingParams p = req.sampling;
    p.seed = sample_seed(req.sampling.seed, k);
    r.sample_params.push_back(p);
  }
  RequestParams params;
  params.max_tokens = req.max_tokens;
  params.stop_token_ids = req.stop_token_ids;
  params.n = req.n;
  params.priority = req.priority;
  params.cache_salt = req.cache_salt;
  Status st = scheduler_->add(id, req.prompt, std::move(params));
  r.request = std::move(req);
  auto [it, inserted] = requests_.emplace(id, std::move(r));
  DI_CHECK(inserted, "request {} accepted twice", id.value());
  if (!st.is_ok()) {
    // submit() validated the same rules, so this is an engine bug: answer, do not crash.
    end_request(id, EngineFinish::kError,
                fmt::format("rejected by the scheduler: {}", st.message()), out);
  }
}

void EngineLoop::end_request(RequestId id, EngineFinish reason, const std::string& error,
                             Outbox& out) {
  auto it = requests_.find(id);
  if (it == requests_.end() || it->second.num_open == 0) return;  // unknown or already ended
  RequestState& r = it->second;
  // Usage per sample from its live sequence; samples of a group not forked yet have none.
  std::map<int32_t, const Sequence*> by_sample;
  std::vector<SeqId> seqs;
  for (const auto& [seq_id, s] : scheduler_->queues().seqs) {
    if (s.request_id != id) continue;
    by_sample[s.sample_idx] = &s;
    seqs.push_back(seq_id);
  }
  const Sequence* parent = by_sample.contains(0) ? by_sample.at(0) : nullptr;
  for (int32_t k = 0; k < r.request.n; ++k) {
    if (r.sample_done[static_cast<size_t>(k)]) continue;
    TokenEvent ev;
    ev.id = id;
    ev.sample_idx = k;
    ev.finish = reason;
    ev.error = error;
    ev.num_prompt_tokens = static_cast<int32_t>(r.request.prompt.size());
    auto s = by_sample.find(k);
    const Sequence* seq = s != by_sample.end() ? s->second : parent;
    if (seq != nullptr) {
      ev.num_cached_tokens = seq->num_cached_tokens;
      ev.num_output_tokens = s != by_sample.end() ? seq->num_output_tokens() : 0;
    }
    out.push_back({r.sink, std::move(ev)});
    close_sample(r, k, reason);
  }
  if (reason == EngineFinish::kStop) {
    for (SeqId seq : seqs) scheduler_->finish(seq, FinishReason::kStop);
  } else {
    scheduler_->abort(id);
  }
}

void EngineLoop::end_all(EngineFinish reason, const std::string& error, Outbox& out) {
  std::vector<RequestId> ids;
  for (const auto& [id, r] : requests_) {
    if (r.num_open > 0) ids.push_back(id);
  }
  std::sort(ids.begin(), ids.end());
  for (RequestId id : ids) end_request(id, reason, error, out);
}

void EngineLoop::close_sample(RequestState& r, int32_t sample_idx, EngineFinish reason) {
  auto& done = r.sample_done[static_cast<size_t>(sample_idx)];
  DI_CHECK(!done, "request {} sample {} ended twice", r.request.id.value(), sample_idx);
  done = 1;
  if (severity(reason) > severity(r.worst)) r.worst = reason;
  if (--r.num_open > 0) return;
  switch (r.worst) {
    case EngineFinish::kError:
      ++counters_.requests_failed;
      break;
    case EngineFinish::kAbort:
      ++counters_.requests_aborted;
      break;
    default:
      ++counters_.requests_finished;
      break;
  }
  closed_.push_back(r.request.id);
}

void EngineLoop::run_step(Outbox& out) {
  StepPlan plan = scheduler_->step();
  const ScheduleResult& sched = plan.schedule;
  DI_CHECK(!sched.empty(), "nothing schedulable with {} waiting and {} running sequences",
           scheduler_->queues().waiting.size(), scheduler_->queues().running.size());

  // One logits row per sample to draw: the last new token of every entry that samples (a group
  // completing its prompt samples n times from the same row).
  struct Draw {
    SeqId seq_id;
    int32_t num_samples;
  };
  std::vector<Draw> draws;
  std::vector<int32_t> logit_rows;
  std::vector<sampling::SamplingRow> rows;
  SamplePlacement placement(device_sampling_, backend_->can_sample_on_device());
  std::map<std::pair<RequestId, int32_t>, size_t> row_of;  // (request, sample_idx) -> row
  int32_t offset = 0;
  for (const auto* list : {&sched.decodes, &sched.prefills}) {
    for (const ScheduledSeq& e : *list) {
      offset += e.num_tokens;
      if (e.num_samples == 0) continue;
      const Sequence& s = scheduler_->queues().seq(e.seq_id);
      RequestState& r = requests_.at(s.request_id);
      const int64_t position = e.start + e.num_tokens;  // index of the token being sampled
      DI_CHECK(position == s.num_tokens(), "sequence {} samples at {} but holds {} tokens",
               e.seq_id.value(), position, s.num_tokens());
      draws.push_back({e.seq_id, e.num_samples});
      for (int32_t k = 0; k < e.num_samples; ++k) {
        const int32_t sample_idx = e.num_samples > 1 ? k : s.sample_idx;
        row_of[{s.request_id, sample_idx}] = rows.size();
        logit_rows.push_back(offset - 1);
        const SamplingParams& params = r.sample_params[static_cast<size_t>(sample_idx)];
        rows.push_back({&params, position, *s.prompt, s.output});
        placement.add_row(params, r.request.logprobs);
      }
    }
  }

  DecodeShape mine = runner_->decode_shape(plan, logit_rows);
  mine.prefill = !sched.prefills.empty();
  const GroupDecode group = agree_step(mine);
  const int64_t graph_steps_before = runner_->graph_steps();
  const bool on_device = placement.on_device();
  const auto t0 = std::chrono::steady_clock::now();
  Tensor logits;
  if (on_device) {
    logits = runner_->execute_on_device(plan, logit_rows, group);
    // Wait for the forward so that forward_us and sample_us keep their meaning (the sampler's
    // first launch then starts on an idle stream: a few microseconds per step).
    backend_->synchronize();
  } else {
    logits = runner_->execute(plan, logit_rows, group);
  }
  const auto t1 = std::chrono::steady_clock::now();
  if (runner_->graph_steps() > graph_steps_before) counters_.graph_forward_us += micros(t1 - t0);
  std::vector<sampling::SampleResult> results;
  // On the device before eplb_->end_step(), whose expert moves go to the same stream.
  if (on_device) results = sample_on_device(logits, rows);
  const auto t2 = std::chrono::steady_clock::now();
  if (eplb_) eplb_->end_step();  // may re-place experts: between steps, on this thread
  const auto t3 = std::chrono::steady_clock::now();
  if (!on_device) {
    results = sampling::sample_batch(
        std::span<const float>(logits.f32(), static_cast<size_t>(logits.numel())),
        runner_->vocab_size(), rows, sample_pool_.get());
  }
  counters_.forward_us += micros(t1 - t0);
  counters_.sample_us += micros(t2 - t1) + micros(std::chrono::steady_clock::now() - t3);

  std::vector<SampledTokens> sampled;
  size_t next = 0;
  for (const Draw& d : draws) {
    SampledTokens st{d.seq_id, {}};
    for (int32_t k = 0; k < d.num_samples; ++k) st.tokens.push_back(results[next++].token);
    sampled.push_back(std::move(st));
  }
  std::vector<SeqEvent> events = scheduler_->update(plan, sampled);
  ++counters_.steps;

  for (const SeqEvent& ev : events) {
    RequestState& r = requests_.at(ev.request_id);
    const sampling::SampleResult& res = results.at(row_of.at({ev.request_id, ev.sample_idx}));
    DI_CHECK(res.token == ev.token, "request {} sample {}: sampled {} but the scheduler reports {}",
             ev.request_id.value(), ev.sample_idx, res.token, ev.token);
    if (!r.counted_prompt) {
      r.counted_prompt = true;
      counters_.prompt_tokens += static_cast<uint64_t>(ev.num_prompt_tokens);
      counters_.cached_prompt_tokens += static_cast<uint64_t>(ev.num_cached_tokens);
    }
    ++counters_.generated_tokens;
    TokenEvent te;
    te.id = ev.request_id;
    te.sample_idx = ev.sample_idx;
    te.token = ev.token;
    te.finish = to_engine_finish(ev.finish_reason);
    te.num_prompt_tokens = ev.num_prompt_tokens;
    te.num_cached_tokens = ev.num_cached_tokens;
    te.num_output_tokens = ev.num_output_tokens;
    if (r.request.logprobs || r.request.sampling.top_logprobs > 0) {
      te.logprob.token = res.token;
      te.logprob.logprob = res.logprob;
      for (const sampling::TokenLogprob& t : res.top_logprobs) {
        te.logprob.top.emplace_back(t.token, t.logprob);
      }
    }
    out.push_back({r.sink, std::move(te)});
    if (ev.finish_reason != FinishReason::kNone) {
      close_sample(r, ev.sample_idx, to_engine_finish(ev.finish_reason));
    }
  }
}

std::vector<sampling::SampleResult> EngineLoop::sample_on_device(
    const Tensor& logits, std::span<const sampling::SamplingRow> rows) {
  std::vector<DeviceSampleRow> device_rows;
  device_rows.reserve(rows.size());
  for (const sampling::SamplingRow& row : rows) {
    device_rows.push_back(device_sample_row(*row.params, row.position));
  }
  const std::vector<int32_t> tokens = backend_->sample_on_device(logits, device_rows);
  DI_CHECK(tokens.size() == rows.size(), "device sampler returned {} tokens for {} rows",
           tokens.size(), rows.size());
  const int64_t vocab = runner_->vocab_size();
  std::vector<sampling::SampleResult> results(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    // -1: every logit of the row is -inf or NaN, where the host sampler throws (sampler.h); the
    // step fails the same way.
    DI_CHECK(tokens[i] >= 0 && tokens[i] < vocab,
             "device sampler: row {} gave token {} (every one of the {} logits -inf or NaN?)", i,
             tokens[i], vocab);
    results[i].token = tokens[i];
  }
  ++counters_.device_sample_steps;
  return results;
}

GroupDecode EngineLoop::agree_step(DecodeShape mine) {
  mine.eplb_steps = eplb_ ? eplb_->num_steps() : -1;
  DecodeShape shape = mine;
  if (hooks_.sync != nullptr) {
    const auto t0 = std::chrono::steady_clock::now();
    shape = hooks_.sync->agree_decode(hooks_.rank_idx, mine);
    counters_.group_wait_us += micros(std::chrono::steady_clock::now() - t0);
    // Nothing of this step ran yet on any rank, and no rank begins its EPLB step.
    DI_CHECK(!shape.failed, "another rank of the DP group failed this step");
    DI_CHECK(shape.eplb_steps == mine.eplb_steps,
             "EPLB: the ranks of the DP group closed different numbers of EPLB steps ({} on rank "
             "{}): their load all-reduces would not pair up",
             mine.eplb_steps, hooks_.rank_idx);
  }
  // Right after the agreement, with nothing in between that can throw: every rank of a group that
  // got here begins its EPLB step (and ends it, in end_step or end_failed_eplb_step).
  if (eplb_) eplb_->begin_step(shape.prefill ? EplbPhase::kPrefill : EplbPhase::kDecode);
  if (hooks_.sync == nullptr) return {};
  GroupDecode group;
  group.member = true;
  if (shape.rows >= 0) {
    group.bucket = ModelRunner::decode_bucket(shape.rows, config_.max_running);
    group.max_blocks = shape.max_blocks;
  }
  if (hooks_.set_exchange_rows) hooks_.set_exchange_rows(hooks_.rank_idx, group.bucket);
  return group;
}

void EngineLoop::run_padding_step() {
  const GroupDecode group = agree_step(DecodeShape{.rows = 0, .max_blocks = 0});
  const int64_t graph_steps_before = runner_->graph_steps();
  const auto t0 = std::chrono::steady_clock::now();
  runner_->execute_padding(group);
  const uint64_t us = micros(std::chrono::steady_clock::now() - t0);
  counters_.forward_us += us;
  if (runner_->graph_steps() > graph_steps_before) counters_.graph_forward_us += us;
  // A padding step is an EPLB step of the group's phase like any other: every rank's bucket
  // boundaries and periods stay aligned. Its token is routed, dispatched and computed like a real
  // one, so it is counted (one row here; on CUDA a graph replay's bucket of padding rows).
  if (eplb_) eplb_->end_step();
  ++counters_.padding_steps;
}

void EngineLoop::end_failed_eplb_step() {
  if (!eplb_ || !eplb_->in_step()) return;
  try {
    eplb_->end_failed_step();
  } catch (const std::exception& e) {
    DI_LOG_ERROR("EPLB: closing the failed step: {}", e.what());
  }
}

void EngineLoop::with_eplb(const std::function<void(EplbRuntime*)>& fn) {
  std::lock_guard state(state_mu_);
  fn(eplb_.get());
}

void EngineLoop::publish_stats() {
  EngineStats s = counters_;
  s.preemptions = static_cast<uint64_t>(scheduler_->num_preemptions());
  s.num_waiting = static_cast<int32_t>(scheduler_->queues().waiting.size());
  s.num_running = static_cast<int32_t>(scheduler_->queues().running.size());
  s.kv_blocks_total = kv_->num_blocks();
  s.kv_blocks_used = kv_->num_blocks() - kv_->num_available_blocks();
  s.kv_blocks_cached = kv_->num_cached_blocks();
  s.graph_steps = static_cast<uint64_t>(runner_->graph_steps());
  if (eplb_) {
    s.eplb_enabled = true;
    s.eplb_rebalances = eplb_->stats().rebalances;
    s.moe_lb = eplb_->stats().moe_lb;
  }
  std::lock_guard lock(stats_mu_);
  stats_ = s;
}

void EngineLoop::deliver(Outbox& out) {
  for (Delivery& d : out) {
    try {
      (*d.sink)(d.event);
    } catch (const std::exception& e) {
      DI_LOG_ERROR("token sink of request {} threw: {}", d.event.id.value(), e.what());
    }
  }
}

void EngineLoop::check_integrity() const {
  std::lock_guard state(state_mu_);
  scheduler_->check_integrity();
  // Every open sample is backed by a live sequence: a sequence with num_samples = n (a group not
  // forked yet) stands for n samples. Closed requests are gone from the scheduler.
  std::unordered_map<RequestId, int32_t> samples;
  for (const auto& [seq_id, s] : scheduler_->queues().seqs) {
    DI_CHECK(requests_.contains(s.request_id), "sequence {} of unknown request {}", seq_id.value(),
             s.request_id.value());
    samples[s.request_id] += s.num_samples;
  }
  for (const auto& [id, r] : requests_) {
    const int32_t live = samples.contains(id) ? samples.at(id) : 0;
    DI_CHECK(live == r.num_open, "request {}: {} open samples but {} live in the scheduler",
             id.value(), r.num_open, live);
    int32_t open = 0;
    for (uint8_t d : r.sample_done) open += d ? 0 : 1;
    DI_CHECK(open == r.num_open, "request {}: {} samples not done, counter says {}", id.value(),
             open, r.num_open);
  }
  std::lock_guard lock(inbox_mu_);
  for (const auto& [id, r] : requests_) {
    DI_CHECK(live_ids_.contains(id), "request {} is live but not in the duplicate-id set",
             id.value());
  }
  const KvLayout& l = runner_->layout();
  DI_CHECK(l.num_blocks == kv_->num_blocks() && l.block_size == kv_->block_size(),
           "KV pool of {} x {} does not match the manager's {} x {}", l.num_blocks, l.block_size,
           kv_->num_blocks(), kv_->block_size());
  // EPLB placement vs device tables (not the weight bytes: that downloads every expert).
  if (eplb_) eplb_->check_integrity(/*compare_weights=*/false);
}

}  // namespace di
