#include "engine/dp_engine_group.h"

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <set>
#include <thread>
#include <utility>

#include "core/env.h"
#include "core/error.h"
#include "core/logging.h"
#include "model/config.h"

namespace di {
namespace {

Status bad(std::string message) {
  return Status(StatusCode::kInvalidArgument, std::move(message));
}

}  // namespace

DpEngineGroup::DpEngineGroup(const EngineConfig& config)
    : config_(config),
      wake_targets_(new std::atomic<EngineLoop*>[static_cast<size_t>(config.dp_size)]),
      open_samples_(static_cast<size_t>(config.dp_size), 0) {
  for (int32_t r = 0; r < config.dp_size; ++r) wake_targets_[r].store(nullptr);
}

Result<std::unique_ptr<Engine>> DpEngineGroup::start(const EngineConfig& config) {
  const int32_t n = config.dp_size;
  if (n < 1) return bad(fmt::format("dp_size must be >= 1, got {}", n));
  const bool on_cpu = config.backend == "cpu";
  std::vector<int32_t> devices = config.dp_devices;
  if (devices.empty()) {
    for (int32_t r = 0; r < n; ++r) devices.push_back(r);
  }
  if (static_cast<int32_t>(devices.size()) != n) {
    return bad(fmt::format("{} devices given for {} DP ranks", devices.size(), n));
  }
  if (!on_cpu && std::set<int32_t>(devices.begin(), devices.end()).size() != devices.size()) {
    return bad(fmt::format("DP ranks need distinct CUDA devices, got {}", fmt::join(devices, ",")));
  }
  Result<ModelConfig> mc = load_model_config(config.model_dir);
  if (!mc.is_ok()) return mc.status();
  const bool moe = mc.value().num_experts > 0;
  if (moe && mc.value().num_experts < n) {
    return bad(fmt::format("--dp-size {} is more than the model's {} routed experts", n,
                           mc.value().num_experts));
  }
  const bool eplb = config.eplb.enabled;
  if (eplb && !moe) return bad("EPLB (--eplb) needs a MoE model");
  if (eplb && config.eplb.ep_ranks != 1 && config.eplb.ep_ranks != n) {
    return bad(fmt::format(
        "--ep-ranks {} with --dp-size {}: a DP group's EPLB places the experts over its {} ranks",
        config.eplb.ep_ranks, n, n));
  }
  EplbOptions eplb_options = config.eplb;
  eplb_options.ep_ranks = n;
  // EPLB: the EP hook owns physical slots, rank r the S of [r·S, (r+1)·S) (eplb_runtime.h).
  const int32_t num_expert_slots =
      eplb ? n * eplb_options.slots_per_rank(mc.value().num_experts) : 0;

  std::unique_ptr<DpEngineGroup> group(new DpEngineGroup(config));
  DpEngineGroup& g = *group;
  try {
    if (moe) {
      if (on_cpu) {
        g.transport_ = make_shm_expert_transport(n);
      } else {
#ifdef DI_HAVE_EP_NCCL
        g.transport_ = make_nccl_expert_transport(devices);
#else
        return bad(fmt::format("backend '{}' with --dp-size needs a CUDA build with NCCL",
                               config.backend));
#endif
      }
      if (eplb) g.loads_ = std::make_unique<GroupLoadSum>(n);
      g.barrier_ = std::make_unique<GroupStepBarrier>(
          n,
          [&g](int32_t r) {
            if (EngineLoop* e = g.wake_targets_[r].load()) e->wake();
          },
          g.transport_.get(), g.loads_.get());
    }
  } catch (const std::exception& e) {
    return Status(StatusCode::kInternal, fmt::format("cannot set up the DP group: {}", e.what()));
  }

  EngineConfig rank_config = config;
  rank_config.dp_size = 0;
  rank_config.dp_devices.clear();
  rank_config.eplb = eplb_options;
  // Decode steps on every rank take the latency exchange (no host sync, so the step graphs stay
  // on); DEEPINFER_EP_LATENCY=0 keeps the throughput exchange (host syncs) everywhere, and with
  // it no graphs. The fp32 verification mode's MoE synchronizes with the host, so its capture
  // would fail after NCCL calls were captured: no graphs there either.
  const bool latency = moe && !on_cpu && !di::env::is("DEEPINFER_EP_LATENCY", "0");
  if (moe && (!latency || config.backend == "cuda-fp32")) rank_config.decode_graphs = false;
  DpExpertTransport* transport = g.transport_.get();
  const std::string backend = config.backend;
  auto bind = [transport, backend, devices](int32_t r) {
    if (transport != nullptr) {
      transport->bind_thread(r);
    } else {
      bind_rank_device(backend, devices[static_cast<size_t>(r)]);
    }
  };
  g.bind_ = bind;
  for (int32_t r = 0; r < n; ++r) {
    Status failed = Status::ok();
    try {
      bind(r);
      EngineConfig this_rank = rank_config;
      this_rank.eplb.log = rank_config.eplb.log && r == 0;  // the group logs its EPLB once
      Result<EngineParts> parts = load_engine_parts(this_rank);
      if (!parts.is_ok()) {
        failed = parts.status();
      } else {
        EngineParts& p = parts.value();
        if (transport != nullptr) {
          transport->attach(r, *p.backend, *p.model, latency ? rank_config.max_running : 0,
                            num_expert_slots);
        }
        EngineLoopHooks hooks;
        hooks.sync = g.barrier_.get();
        hooks.rank_idx = r;
        if (n > 1) {  // the ranks sample concurrently: a share of the cores each
          const int hw = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
          hooks.sample_threads = std::max(1, hw / n);
        }
        if (latency) {
          hooks.set_exchange_rows = [transport](int32_t rank_idx, int32_t rows) {
            transport->set_latency_rows(rank_idx, rows);
          };
        }
        if (!on_cpu) hooks.bind_thread = bind;
        hooks.eplb_loads = g.loads_.get();
        g.ranks_.push_back(std::make_unique<EngineLoop>(this_rank, std::move(p.backend),
                                                        std::move(p.model), p.num_blocks,
                                                        p.max_model_len, std::move(hooks)));
        g.wake_targets_[r].store(g.ranks_.back().get());
      }
    } catch (const std::exception& e) {
      failed = Status(StatusCode::kInternal, e.what());
    }
    if (!failed.is_ok()) {
      // Ranks already running would wait at the barrier for ranks that will never exist.
      if (g.barrier_) g.barrier_->abandon();
      return Status(failed.code(), fmt::format("DP rank {} of {}: {}", r, n, failed.message()));
    }
  }
  for (const auto& rank : g.ranks_) {
    DI_CHECK(rank->max_model_len() == g.ranks_.front()->max_model_len(),
             "DP ranks disagree on max_model_len");
  }
  if (moe) {
    const int64_t spr = (mc.value().num_experts + n - 1) / n;
    DI_LOG_INFO(
        "DP group: {} ranks ({}), DP attention + EP over {}: {} routed experts, {} per rank{}; "
        "KV pool of {} blocks per rank; decode steps: {}",
        n, on_cpu ? "CPU threads" : fmt::format("CUDA devices {}", fmt::join(devices, ",")),
        on_cpu ? "shared memory" : "NCCL", mc.value().num_experts, spr,
        eplb ? fmt::format(" (EPLB: {} weight slots per rank, every rank holds all {})",
                           num_expert_slots / n, num_expert_slots)
             : std::string(),
        g.ranks_.front()->stats().kv_blocks_total,
        latency ? (rank_config.decode_graphs ? "latency exchange + CUDA graphs"
                                             : "latency exchange, eager")
                : "throughput exchange, eager");
  } else {
    DI_LOG_INFO("DP group: {} independent ranks (dense model: no expert exchange)", n);
  }
  return std::unique_ptr<Engine>(std::move(group));
}

DpEngineGroup::~DpEngineGroup() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;  // submit() refuses from now on
  }
  if (barrier_) barrier_->request_stop();
  // Each destructor joins its thread; the threads leave together through the barrier's stop
  // round (request_stop above woke every rank). A rank's backend is freed on its own device.
  for (size_t r = 0; r < ranks_.size(); ++r) {
    try {
      if (bind_) bind_(static_cast<int32_t>(r));
    } catch (const std::exception& e) {
      DI_LOG_ERROR("DP rank {}: cannot bind its device to shut it down: {}", r, e.what());
    }
    wake_targets_[r].store(nullptr);
    ranks_[r].reset();
  }
  ranks_.clear();
}

int32_t DpEngineGroup::pick_rank() const {
  int32_t best = 0;
  int32_t best_open = 0, best_kv = 0;
  for (int32_t r = 0; r < num_ranks(); ++r) {
    const int32_t open = open_samples_[static_cast<size_t>(r)];
    const int32_t kv = ranks_[static_cast<size_t>(r)]->stats().kv_blocks_used;
    if (r == 0 || open < best_open || (open == best_open && kv < best_kv)) {
      best = r;
      best_open = open;
      best_kv = kv;
    }
  }
  return best;
}

Status DpEngineGroup::submit(EngineRequest request, TokenSink sink) {
  if (!sink) return Status(StatusCode::kInvalidArgument, "the token sink is empty");
  const RequestId id = request.id;
  const int32_t n = request.n;
  std::lock_guard lock(mu_);
  if (stopping_) return Status(StatusCode::kUnavailable, "the engine is shutting down");
  if (placement_.contains(id)) {
    return make_status(StatusCode::kAlreadyExists, "request {} is already running", id.value());
  }
  if (request.dp_rank < -1 || request.dp_rank >= num_ranks()) {
    return make_status(StatusCode::kInvalidArgument, "dp_rank must be in [-1, {}), got {}",
                       num_ranks(), request.dp_rank);
  }
  const int32_t r = request.dp_rank >= 0 ? request.dp_rank : pick_rank();
  auto user = std::make_shared<TokenSink>(std::move(sink));
  TokenSink wrapped = [this, user, id](const TokenEvent& e) {
    if (e.finish != EngineFinish::kNone) release_sample(id);
    (*user)(e);
  };
  // Under mu_: the wrapped sink (release_sample) waits for it, so the placement below exists
  // before the request's first final event is handled.
  Status st = ranks_[static_cast<size_t>(r)]->submit(std::move(request), std::move(wrapped));
  if (st.is_ok()) {
    placement_[id] = Placement{r, n};
    open_samples_[static_cast<size_t>(r)] += n;
  }
  return st;
}

void DpEngineGroup::release_sample(RequestId id) {
  std::lock_guard lock(mu_);
  auto it = placement_.find(id);
  DI_CHECK(it != placement_.end() && it->second.open_samples > 0,
           "DP group: a final event for request {}, which has no open sample", id.value());
  --open_samples_[static_cast<size_t>(it->second.rank_idx)];
  if (--it->second.open_samples == 0) placement_.erase(it);
}

int32_t DpEngineGroup::rank_of(RequestId id) const {
  std::lock_guard lock(mu_);
  auto it = placement_.find(id);
  return it == placement_.end() ? -1 : it->second.rank_idx;
}

void DpEngineGroup::abort(RequestId id) {
  const int32_t r = rank_of(id);
  if (r >= 0) ranks_[static_cast<size_t>(r)]->abort(id);
}

void DpEngineGroup::finish(RequestId id) {
  const int32_t r = rank_of(id);
  if (r >= 0) ranks_[static_cast<size_t>(r)]->finish(id);
}

EngineStats DpEngineGroup::stats() const {
  EngineStats sum;
  for (const auto& rank : ranks_) {
    const EngineStats s = rank->stats();
    sum.requests_finished += s.requests_finished;
    sum.requests_aborted += s.requests_aborted;
    sum.requests_failed += s.requests_failed;
    sum.prompt_tokens += s.prompt_tokens;
    sum.cached_prompt_tokens += s.cached_prompt_tokens;
    sum.generated_tokens += s.generated_tokens;
    sum.preemptions += s.preemptions;
    sum.steps += s.steps;
    sum.graph_steps += s.graph_steps;
    sum.device_sample_steps += s.device_sample_steps;
    sum.padding_steps += s.padding_steps;
    sum.forward_us += s.forward_us;
    sum.graph_forward_us += s.graph_forward_us;
    sum.sample_us += s.sample_us;
    sum.group_wait_us += s.group_wait_us;
    sum.num_waiting += s.num_waiting;
    sum.num_running += s.num_running;
    sum.kv_blocks_total += s.kv_blocks_total;
    sum.kv_blocks_used += s.kv_blocks_used;
    sum.kv_blocks_cached += s.kv_blocks_cached;
    sum.dp_ranks.push_back({s.num_running, s.num_waiting, s.kv_blocks_used});
  }
  // EPLB: every rank applies the same placements from the same summed loads, so rank 0's
  // counters are the group's.
  const EngineStats first = ranks_.front()->stats();
  sum.eplb_enabled = first.eplb_enabled;
  sum.eplb_rebalances = first.eplb_rebalances;
  sum.moe_lb = first.moe_lb;
  sum.dp_size = num_ranks();
  return sum;
}

void DpEngineGroup::check_integrity() const {
  for (const auto& rank : ranks_) rank->check_integrity();
  if (loads_) {
    // The ranks step concurrently, so each rank's history is read at its own moment: any two
    // histories agree on their common prefix (same phase, step and placement per rebalance).
    std::vector<std::vector<EplbRebalanceRecord>> history(ranks_.size());
    for (size_t r = 0; r < ranks_.size(); ++r) {
      ranks_[r]->with_eplb([&](EplbRuntime* e) {
        DI_CHECK(e != nullptr, "DP group: rank {} has no EPLB runtime", r);
        history[r] = e->history();
      });
    }
    for (size_t r = 1; r < ranks_.size(); ++r) {
      const size_t common = std::min(history[0].size(), history[r].size());
      for (size_t i = 0; i < common; ++i) {
        DI_CHECK(history[0][i] == history[r][i],
                 "DP group: EPLB rebalance #{} differs on ranks 0 and {} (step {} / {}, "
                 "placement {:x} / {:x})",
                 i + 1, r, history[0][i].step, history[r][i].step, history[0][i].placement_digest,
                 history[r][i].placement_digest);
      }
    }
  }
  // Group invariants. mu_ first, then each rank's inbox lock (the order submit() uses): a live
  // id of a rank stays live until its final event's delivery, which waits for mu_ in
  // release_sample, so both views are consistent.
  std::lock_guard lock(mu_);
  std::vector<int32_t> open(static_cast<size_t>(num_ranks()), 0);
  for (const auto& [id, p] : placement_) {
    DI_CHECK(p.rank_idx >= 0 && p.rank_idx < num_ranks() && p.open_samples > 0,
             "DP group: request {} placed on rank {} with {} open samples", id.value(), p.rank_idx,
             p.open_samples);
    open[static_cast<size_t>(p.rank_idx)] += p.open_samples;
  }
  DI_CHECK(open == open_samples_, "DP group: per-rank open samples {} but the table says {}",
           fmt::join(open_samples_, ","), fmt::join(open, ","));
  std::unordered_map<RequestId, int32_t> live_on;
  for (int32_t r = 0; r < num_ranks(); ++r) {
    for (RequestId id : ranks_[static_cast<size_t>(r)]->live_request_ids()) {
      auto [it, inserted] = live_on.emplace(id, r);
      DI_CHECK(inserted, "DP group: request {} is live on ranks {} and {}", id.value(), it->second,
               r);
      auto p = placement_.find(id);
      DI_CHECK(p != placement_.end() && p->second.rank_idx == r,
               "DP group: request {} is live on rank {} but placed on {}", id.value(), r,
               p == placement_.end() ? -1 : p->second.rank_idx);
    }
  }
}

}  // namespace di
