#include "engine/eplb_runtime.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <span>

#include "core/error.h"
#include "core/logging.h"
#include "engine/group_load_sum.h"

namespace di {
namespace {

using parallel::EplbConfig;
using parallel::ExpertPlacement;

Tensor host_i32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty({static_cast<int64_t>(v.size())}, DType::kI32);
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t;
}

double mean(const std::vector<double>& v) {
  if (v.empty()) return 1.0;
  double s = 0.0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

Shape with_rows(const Shape& shape, int64_t rows) {
  Shape s = shape;
  s[0] = rows;
  return s;
}

const char* phase_name(EplbPhase p) {
  return p == EplbPhase::kPrefill ? "prefill" : "decode";
}

}  // namespace

int32_t EplbOptions::slots_per_rank(int32_t num_experts) const {
  return (num_experts + ep_ranks - 1) / ep_ranks +
         std::max(prefill.redundant_per_rank, decode.redundant_per_rank);
}

void EplbOptions::validate() const {
  DI_CHECK(ep_ranks >= 1, "--ep-ranks must be >= 1, got {}", ep_ranks);
  prefill.validate();
  decode.validate();
}

std::string EplbOptions::describe() const {
  auto one = [](const EplbConfig& c) {
    return fmt::format("redundant {} window {} period {} bucket {} min_gain {}",
                       c.redundant_per_rank, c.window_steps, c.period_steps, c.steps_per_bucket,
                       c.min_gain);
  };
  return fmt::format("EPLB on: {} simulated EP ranks; prefill: {}; decode: {}", ep_ranks,
                     one(prefill), one(decode));
}

EplbRuntime::EplbRuntime(Model& model, Backend& backend, const EplbOptions& options,
                         GroupLoadSum* group, int32_t rank_idx)
    : backend_(backend), options_(options), group_(group), rank_idx_(rank_idx) {
  options_.validate();
  DI_CHECK(group == nullptr || (group->num_ranks() == options_.ep_ranks && rank_idx >= 0 &&
                                rank_idx < group->num_ranks()),
           "EPLB: rank {} of a group of {} with {} EP ranks", rank_idx,
           group ? group->num_ranks() : 0, options_.ep_ranks);
  const std::vector<MoeBlock*> blocks = model.moe_blocks();
  DI_CHECK(!blocks.empty(), "EPLB: the model ({}) has no MoE layers",
           arch_name(model.config().arch));
  const int32_t n = options_.ep_ranks;
  num_experts_ = static_cast<int32_t>(blocks[0]->experts.gate_up.size(0));
  for (const MoeBlock* b : blocks) {
    DI_CHECK(!b->experts.gate_up.is_null() && b->eplb == nullptr,
             "EPLB: a MoE block has no expert weights or is already attached");
    DI_CHECK(b->experts.gate_up.size(0) == num_experts_ &&
                 b->experts.down.size(0) == num_experts_ && b->routing.num_experts == num_experts_,
             "EPLB: MoE layers differ in expert count ({} vs {})", b->experts.gate_up.size(0),
             num_experts_);
  }
  slots_per_rank_ = options_.slots_per_rank(num_experts_);
  num_slots_ = n * slots_per_rank_;
  const std::vector<int64_t> uniform(static_cast<size_t>(num_experts_), 1);
  const ExpertPlacement initial =
      parallel::plan_placement(uniform, parallel::PlannerOptions{n, slots_per_rank_});
  const std::vector<ExpertPlacement> initials(blocks.size(), initial);
  controllers_[0] = std::make_unique<parallel::EplbController>(options_.prefill, initials);
  controllers_[1] = std::make_unique<parallel::EplbController>(options_.decode, initials);
  for (auto& t : totals_)
    t.assign(blocks.size(), std::vector<int64_t>(static_cast<size_t>(num_experts_), 0));
  for (auto& p : pending_) p.assign(blocks.size() * static_cast<size_t>(num_experts_), 0);
  zero_counts_ = backend_.zeros({num_experts_}, DType::kI32);

  layers_.resize(blocks.size());  // never resized again: blocks point into it
  for (size_t l = 0; l < blocks.size(); ++l) {
    Layer& L = layers_[l];
    L.block = blocks[l];
    const ExpertWeights& logical = L.block->experts;
    L.state.physical.gate_up =
        backend_.zeros(with_rows(logical.gate_up.shape(), num_slots_), logical.gate_up.dtype());
    L.state.physical.down =
        backend_.zeros(with_rows(logical.down.shape(), num_slots_), logical.down.dtype());
    for (int32_t s = 0; s < num_slots_; ++s) {
      const int32_t e = initial.expert_at(s);
      if (e == parallel::kEmptySlot) continue;
      backend_.copy_rows(logical.gate_up, e, L.state.physical.gate_up, s, 1);
      backend_.copy_rows(logical.down, e, L.state.physical.down, s, 1);
    }
    L.state.replica_indptr = backend_.zeros({num_experts_ + 1}, DType::kI32);
    L.state.replica_slots = backend_.zeros({num_slots_}, DType::kI32);
    upload_tables(static_cast<int32_t>(l), initial);
    L.counts[0] = backend_.zeros({num_experts_}, DType::kI32);
    L.counts[1] = backend_.zeros({num_experts_}, DType::kI32);
  }
  backend_.synchronize();
  for (Layer& L : layers_) {
    L.block->experts = ExpertWeights{};  // the slots hold every expert now
    L.block->eplb = &L.state;
  }
  if (options_.log) {
    DI_LOG_INFO("{}; {} MoE layers x {} experts -> {} weight slots ({} per rank){}",
                options_.describe(), layers_.size(), num_experts_, num_slots_, slots_per_rank_,
                group_ ? "; DP group: every rank holds all slots, computes its own, loads summed "
                         "over the group"
                       : "");
  }
}

EplbRuntime::~EplbRuntime() {
  // Give the model its logical experts back (first replica of each), so it keeps working.
  try {
    const std::vector<ExpertPlacement>& placement = placements();
    for (size_t l = 0; l < layers_.size(); ++l) {
      Layer& L = layers_[l];
      ExpertWeights logical;
      logical.gate_up = backend_.empty(with_rows(L.state.physical.gate_up.shape(), num_experts_),
                                       L.state.physical.gate_up.dtype());
      logical.down = backend_.empty(with_rows(L.state.physical.down.shape(), num_experts_),
                                    L.state.physical.down.dtype());
      for (int32_t e = 0; e < num_experts_; ++e) {
        const int32_t s = placement[l].replicas(e)[0];
        backend_.copy_rows(L.state.physical.gate_up, s, logical.gate_up, e, 1);
        backend_.copy_rows(L.state.physical.down, s, logical.down, e, 1);
      }
      L.block->experts = std::move(logical);
      L.block->eplb = nullptr;
    }
    backend_.synchronize();
  } catch (const std::exception& e) {
    DI_LOG_ERROR("EPLB: restoring the logical experts failed: {}", e.what());
  }
}

const std::vector<ExpertPlacement>& EplbRuntime::placements() const {
  return controllers_[0]->placements();
}

void EplbRuntime::upload_tables(int32_t layer, const ExpertPlacement& placement) {
  std::vector<int32_t> indptr{0}, slots;
  for (int32_t e = 0; e < num_experts_; ++e) {
    for (int32_t s : placement.replicas(e)) slots.push_back(s);
    indptr.push_back(static_cast<int32_t>(slots.size()));
  }
  DI_CHECK(static_cast<int32_t>(slots.size()) <= num_slots_, "EPLB: {} replicas for {} slots",
           slots.size(), num_slots_);
  slots.resize(static_cast<size_t>(num_slots_), 0);
  // Overwrite the existing device tables in place (their addresses are baked into CUDA graphs).
  // The uploaded temporaries are freed in stream order; apply() synchronizes before returning.
  MoeEplbState& st = layers_[static_cast<size_t>(layer)].state;
  Tensor d_indptr = backend_.upload(host_i32(indptr), DType::kI32);
  Tensor d_slots = backend_.upload(host_i32(slots), DType::kI32);
  backend_.copy_rows(d_indptr, 0, st.replica_indptr, 0, num_experts_ + 1);
  backend_.copy_rows(d_slots, 0, st.replica_slots, 0, num_slots_);
  backend_.synchronize();
}

void EplbRuntime::begin_step(EplbPhase phase) {
  in_step_ = true;  // a step whose forward threw never reached end_step: its counts stay
  phase_ = phase;
  for (Layer& L : layers_) L.state.counts = &L.counts[static_cast<size_t>(phase)];
}

void EplbRuntime::flush_counts(EplbPhase phase) {
  const size_t p = static_cast<size_t>(phase);
  const auto ne = static_cast<size_t>(num_experts_);
  for (size_t l = 0; l < layers_.size(); ++l) {
    Tensor host = backend_.download(layers_[l].counts[p]);
    DI_CHECK(host.dtype() == DType::kI32 && host.numel() == num_experts_,
             "EPLB: counts read back as {}", host.describe());
    const int32_t* c = host.data<int32_t>();
    for (size_t e = 0; e < ne; ++e) {
      totals_[p][l][e] += c[e];
      pending_[p][l * ne + e] += c[e];
    }
    backend_.copy_rows(zero_counts_, 0, layers_[l].counts[p], 0, num_experts_);
  }
}

void EplbRuntime::close_bucket(EplbPhase phase) {
  const size_t p = static_cast<size_t>(phase);
  try {
    flush_counts(phase);
  } catch (const std::exception& e) {
    // The other ranks would wait for this rank's bucket forever.
    if (group_)
      group_->abort(fmt::format("rank {} cannot read its counts: {}", rank_idx_, e.what()));
    throw;
  }
  std::vector<int64_t>& loads = pending_[p];
  if (group_) group_->all_reduce(rank_idx_, loads);  // every rank: the same sum, in rank order
  const auto ne = static_cast<size_t>(num_experts_);
  for (size_t l = 0; l < layers_.size(); ++l) {
    controllers_[p]->add_loads(static_cast<int32_t>(l),
                               std::span<const int64_t>(loads.data() + l * ne, ne));
  }
  std::fill(loads.begin(), loads.end(), 0);
}

double EplbRuntime::current_moe_lb(EplbPhase phase) const {
  const parallel::EplbController& ctrl = *controllers_[static_cast<size_t>(phase)];
  std::vector<double> lbs;
  for (size_t l = 0; l < layers_.size(); ++l) {
    lbs.push_back(parallel::moe_lb(parallel::expected_rank_loads(
        ctrl.placements()[l], ctrl.window().loads(static_cast<int32_t>(l)))));
  }
  return mean(lbs);
}

bool EplbRuntime::end_step() {
  DI_CHECK(in_step_, "EPLB: end_step without begin_step");
  in_step_ = false;
  for (Layer& L : layers_) L.state.counts = nullptr;
  const EplbPhase phase = phase_;
  parallel::EplbController& ctrl = *controllers_[static_cast<size_t>(phase)];
  // Read the device counts only when this step completes a bucket of the window (every step for
  // prefill's 1-step buckets, every 10th decode step by default).
  const bool bucket_done = (ctrl.step() + 1) % ctrl.config().steps_per_bucket == 0;
  if (bucket_done) close_bucket(phase);
  std::optional<parallel::Rebalance> plan = ctrl.end_step();
  if (bucket_done) stats_.moe_lb = current_moe_lb(phase);
  if (!plan) return false;
  apply(*plan, phase);
  return true;
}

bool EplbRuntime::end_failed_step() {
  return in_step_ ? end_step() : false;
}

bool EplbRuntime::rebalance_now(EplbPhase phase) {
  DI_CHECK(!in_step_, "EPLB: rebalance_now inside a step");
  DI_CHECK(group_ == nullptr, "EPLB: rebalance_now on one rank of a DP group");
  parallel::EplbController& ctrl = *controllers_[static_cast<size_t>(phase)];
  std::optional<parallel::Rebalance> plan = ctrl.plan_now();
  if (!plan) return false;
  apply(*plan, phase);
  return true;
}

void EplbRuntime::apply(const parallel::Rebalance& plan, EplbPhase phase) {
  DI_CHECK(plan.placements.size() == layers_.size(), "EPLB: plan for {} layers, model has {}",
           plan.placements.size(), layers_.size());
  const std::vector<parallel::ExpertMove>& moves = plan.migration.moves;
  // Moves of one layer: gather every source slot into a staging buffer first, then scatter, so a
  // slot that is both a source and a destination within the layer is read before it is written.
  size_t begin = 0;
  while (begin < moves.size()) {
    const int32_t l = moves[begin].layer_idx;
    size_t end = begin;
    while (end < moves.size() && moves[end].layer_idx == l) ++end;
    DI_CHECK(l >= 0 && l < num_layers(), "EPLB: move for layer {}", l);
    ExpertWeights& phys = layers_[static_cast<size_t>(l)].state.physical;
    const auto m = static_cast<int64_t>(end - begin);
    for (Tensor* w : {&phys.gate_up, &phys.down}) {
      Tensor staging = backend_.empty(with_rows(w->shape(), m), w->dtype());
      for (int64_t i = 0; i < m; ++i) {
        const parallel::ExpertMove& mv = moves[begin + static_cast<size_t>(i)];
        DI_CHECK(
            mv.src_slot >= 0 && mv.src_slot < num_slots_ && mv.dst_slot >= 0 &&
                mv.dst_slot < num_slots_ && mv.src_slot != mv.dst_slot &&
                placements()[static_cast<size_t>(l)].expert_at(mv.src_slot) == mv.expert_idx &&
                plan.placements[static_cast<size_t>(l)].expert_at(mv.dst_slot) == mv.expert_idx,
            "EPLB: bad move of expert {} in layer {}: slot {} -> {}", mv.expert_idx, l, mv.src_slot,
            mv.dst_slot);
        backend_.copy_rows(*w, mv.src_slot, staging, i, 1);
      }
      for (int64_t i = 0; i < m; ++i) {
        backend_.copy_rows(staging, i, *w, moves[begin + static_cast<size_t>(i)].dst_slot, 1);
      }
      backend_.synchronize();  // staging is freed at the end of this scope
    }
    begin = end;
  }
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (plan.changed[l]) upload_tables(static_cast<int32_t>(l), plan.placements[l]);
  }
  // Both phases serve with the one placement the device holds.
  controllers_[0]->commit(plan);
  controllers_[1]->commit(plan);
  history_.push_back({phase, plan.step, placement_digest()});
  ++stats_.rebalances;
  stats_.experts_moved += moves.size();
  stats_.moe_lb_before = mean(plan.moe_lb_current);
  stats_.moe_lb_after = mean(plan.moe_lb_planned);
  stats_.moe_lb = stats_.moe_lb_after;
  if (options_.log) {
    const auto changed = std::count(plan.changed.begin(), plan.changed.end(), true);
    DI_LOG_INFO(
        "EPLB rebalance #{} ({} step {}{}): moe_lb {:.3f} -> {:.3f} (mean of {} MoE layers, {} "
        "re-placed), {} expert copies{}",
        stats_.rebalances, phase_name(phase), plan.step,
        group_ ? fmt::format(", DP group of {}", group_->num_ranks()) : std::string(),
        stats_.moe_lb_before, stats_.moe_lb_after, layers_.size(), changed, moves.size(),
        group_ ? " on every rank" : "");
  }
}

std::vector<std::vector<int64_t>> EplbRuntime::total_counts(EplbPhase phase) {
  flush_counts(phase);
  return totals_[static_cast<size_t>(phase)];
}

uint64_t EplbRuntime::placement_digest() const {
  uint64_t h = 1469598103934665603ull;
  for (const ExpertPlacement& p : placements()) {
    for (int32_t s = 0; s < p.num_slots(); ++s) {
      h = (h ^ static_cast<uint32_t>(p.expert_at(s))) * 1099511628211ull;
    }
  }
  return h;
}

void EplbRuntime::set_trace(std::vector<std::vector<int32_t>>* traces) {
  DI_CHECK(traces == nullptr || traces->size() == layers_.size(), "EPLB: {} traces for {} layers",
           traces ? traces->size() : 0, layers_.size());
  for (size_t l = 0; l < layers_.size(); ++l)
    layers_[l].state.trace = traces ? &(*traces)[l] : nullptr;
}

void EplbRuntime::check_integrity(bool compare_weights) {
  const std::vector<ExpertPlacement>& pl = placements();
  DI_CHECK(controllers_[1]->placements() == pl, "EPLB: the phases disagree on the placement");
  DI_CHECK(pl.size() == layers_.size(), "EPLB: {} placements for {} layers", pl.size(),
           layers_.size());
  DI_CHECK(history_.empty() || history_.back().placement_digest == placement_digest(),
           "EPLB: the placement is not the last one applied (rebalance #{})", history_.size());
  for (size_t l = 0; l < layers_.size(); ++l) {
    const ExpertPlacement& p = pl[l];
    p.check_integrity();
    DI_CHECK(p.num_slots() == num_slots_ && p.num_experts() == num_experts_,
             "EPLB: layer {} placement has {} slots / {} experts", l, p.num_slots(),
             p.num_experts());
    const Layer& L = layers_[l];
    DI_CHECK(L.block->eplb == &L.state, "EPLB: layer {} is detached", l);
    Tensor indptr = backend_.download(L.state.replica_indptr);
    Tensor slots = backend_.download(L.state.replica_slots);
    const int32_t* ip = indptr.data<int32_t>();
    const int32_t* sl = slots.data<int32_t>();
    DI_CHECK(ip[0] == 0, "EPLB: layer {} indptr starts at {}", l, ip[0]);
    for (int32_t e = 0; e < num_experts_; ++e) {
      const auto reps = p.replicas(e);
      DI_CHECK(!reps.empty() && ip[e + 1] - ip[e] == static_cast<int32_t>(reps.size()),
               "EPLB: layer {} expert {}: {} replicas on the device, {} planned", l, e,
               ip[e + 1] - ip[e], reps.size());
      for (size_t i = 0; i < reps.size(); ++i) {
        const int32_t s = sl[ip[e] + static_cast<int32_t>(i)];
        DI_CHECK(s == reps[i] && p.expert_at(s) == e,
                 "EPLB: layer {} expert {} replica {} is slot {} (planned {}, holds {})", l, e, i,
                 s, reps[i], p.expert_at(s));
      }
    }
    if (!compare_weights) continue;
    // Replicas of one expert hold identical weights.
    for (const Tensor* w : {&L.state.physical.gate_up, &L.state.physical.down}) {
      Tensor host = backend_.download(*w);
      const size_t row = host.nbytes() / static_cast<size_t>(host.size(0));
      const auto* base = static_cast<const char*>(host.raw());
      for (int32_t e = 0; e < num_experts_; ++e) {
        const auto reps = p.replicas(e);
        for (size_t i = 1; i < reps.size(); ++i) {
          DI_CHECK(std::memcmp(base + static_cast<size_t>(reps[0]) * row,
                               base + static_cast<size_t>(reps[i]) * row, row) == 0,
                   "EPLB: layer {} expert {}: slots {} and {} hold different weights", l, e,
                   reps[0], reps[i]);
        }
      }
    }
  }
}

}  // namespace di
