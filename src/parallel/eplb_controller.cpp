#include "parallel/eplb_controller.h"

#include <algorithm>

#include "core/error.h"

namespace di::parallel {
namespace {

void check_same_shape(const ExpertPlacement& a, const ExpertPlacement& b) {
  DI_CHECK(a.num_experts() == b.num_experts() && a.num_ranks() == b.num_ranks() &&
               a.slots_per_rank() == b.slots_per_rank(),
           "placements differ in shape: {} experts / {} ranks / {} slots vs {} / {} / {}",
           a.num_experts(), a.num_ranks(), a.slots_per_rank(), b.num_experts(), b.num_ranks(),
           b.slots_per_rank());
}

std::vector<ExpertPlacement> uniform_placements(int32_t num_layers, int32_t num_experts,
                                                int32_t num_ranks, int32_t slots_per_rank) {
  DI_CHECK(num_layers > 0, "controller for {} layers", num_layers);
  const std::vector<int64_t> uniform(num_experts, 1);
  const ExpertPlacement p = plan_placement(uniform, {num_ranks, slots_per_rank});
  return std::vector<ExpertPlacement>(num_layers, p);
}

int32_t slots_for(const EplbConfig& config, int32_t num_experts, int32_t num_ranks) {
  DI_CHECK(num_experts > 0 && num_ranks > 0, "{} experts over {} ranks", num_experts, num_ranks);
  return (num_experts + num_ranks - 1) / num_ranks + config.redundant_per_rank;
}

}  // namespace

void EplbConfig::validate() const {
  DI_CHECK(redundant_per_rank >= 0, "redundant_per_rank {} < 0", redundant_per_rank);
  DI_CHECK(window_steps > 0 && period_steps > 0, "window {} and period {} must be positive",
           window_steps, period_steps);
  DI_CHECK(steps_per_bucket > 0 && window_steps % steps_per_bucket == 0,
           "window of {} steps is not a multiple of the {}-step bucket", window_steps,
           steps_per_bucket);
  DI_CHECK(min_gain >= 0.0, "min_gain {} < 0", min_gain);
}

ExpertPlacement align_to(const ExpertPlacement& current, const ExpertPlacement& next) {
  check_same_shape(current, next);
  const int32_t s_per = next.slots_per_rank();
  std::vector<int32_t> table(next.num_slots(), kEmptySlot);
  for (int32_t q = 0; q < next.num_ranks(); ++q) {
    const int32_t base = q * s_per;
    std::vector<int32_t> arriving;
    for (int32_t s = 0; s < s_per; ++s) {
      const int32_t e = next.expert_at(base + s);
      if (e == kEmptySlot) continue;
      const int32_t old_slot = current.slot_on_rank(e, q);
      if (old_slot != kEmptySlot) {
        table[old_slot] = e;
      } else {
        arriving.push_back(e);
      }
    }
    std::sort(arriving.begin(), arriving.end());
    size_t next_arrival = 0;
    for (int32_t s = 0; s < s_per && next_arrival < arriving.size(); ++s) {
      if (table[base + s] == kEmptySlot) table[base + s] = arriving[next_arrival++];
    }
  }
  return ExpertPlacement(next.num_experts(), next.num_ranks(), s_per, std::move(table));
}

MigrationPlan plan_migration(const std::vector<ExpertPlacement>& current,
                             const std::vector<ExpertPlacement>& next) {
  DI_CHECK(current.size() == next.size(), "{} current layers, {} next", current.size(),
           next.size());
  MigrationPlan plan;
  for (size_t l = 0; l < next.size(); ++l) {
    const ExpertPlacement& cur = current[l];
    const ExpertPlacement& nxt = next[l];
    check_same_shape(cur, nxt);
    std::vector<int32_t> outgoing(cur.num_slots(), 0);
    std::vector<int32_t> incoming(nxt.num_ranks(), 0);
    for (int32_t s = 0; s < nxt.num_slots(); ++s) {
      const int32_t e = nxt.expert_at(s);
      if (e == kEmptySlot || cur.expert_at(s) == e) continue;
      const int32_t q = nxt.rank_of_slot(s);
      DI_CHECK(cur.slot_on_rank(e, q) == kEmptySlot,
               "layer {}: expert {} stays on rank {} but changes slot (align_to first)", l, e, q);
      int32_t src = kEmptySlot;
      for (int32_t candidate : cur.replicas(e)) {
        if (src == kEmptySlot || outgoing[candidate] < outgoing[src]) src = candidate;
      }
      ++outgoing[src];
      ++incoming[q];
      plan.moves.push_back({static_cast<int32_t>(l), e, src, s});
    }
    for (int32_t c : incoming) plan.max_incoming_per_rank = std::max(plan.max_incoming_per_rank, c);
  }
  return plan;
}

EplbController::EplbController(const EplbConfig& config, int32_t num_layers, int32_t num_experts,
                               int32_t num_ranks)
    : EplbController(config, uniform_placements(num_layers, num_experts, num_ranks,
                                                slots_for(config, num_experts, num_ranks))) {}

EplbController::EplbController(const EplbConfig& config, std::vector<ExpertPlacement> initial)
    : config_(config),
      slots_per_rank_(initial.empty() ? 0 : initial[0].slots_per_rank()),
      placements_(std::move(initial)),
      window_(static_cast<int32_t>(placements_.size()),
              placements_.empty() ? 0 : placements_[0].num_experts(), config.window_steps,
              config.steps_per_bucket) {
  config_.validate();
  for (const ExpertPlacement& p : placements_) check_same_shape(placements_[0], p);
}

std::optional<Rebalance> EplbController::plan_now() const {
  if (window_.steps_in_window() == 0) return std::nullopt;
  const int32_t num_layers = window_.num_layers();
  const PlannerOptions options{placements_[0].num_ranks(), slots_per_rank_};
  Rebalance r;
  r.step = step();
  r.changed.assign(num_layers, false);
  bool any = false;
  for (int32_t l = 0; l < num_layers; ++l) {
    const std::span<const int64_t> load = window_.loads(l);
    const ExpertPlacement& cur = placements_[l];
    const double before = moe_lb(expected_rank_loads(cur, load));
    ExpertPlacement planned = align_to(cur, plan_placement(load, options));
    const double after = moe_lb(expected_rank_loads(planned, load));
    if (before - after >= config_.min_gain && !(planned == cur)) {
      r.placements.push_back(std::move(planned));
      r.moe_lb_planned.push_back(after);
      r.changed[l] = true;
      any = true;
    } else {
      r.placements.push_back(cur);
      r.moe_lb_planned.push_back(before);
    }
    r.moe_lb_current.push_back(before);
  }
  if (!any) return std::nullopt;
  r.migration = plan_migration(placements_, r.placements);
  return r;
}

std::optional<Rebalance> EplbController::end_step() {
  window_.end_step();
  if (pending_ || step() % config_.period_steps != 0) return std::nullopt;
  std::optional<Rebalance> r = plan_now();
  pending_ = r.has_value();
  return r;
}

void EplbController::commit(const Rebalance& plan) {
  DI_CHECK(plan.placements.size() == placements_.size(), "plan has {} layers, controller {}",
           plan.placements.size(), placements_.size());
  for (size_t l = 0; l < placements_.size(); ++l)
    check_same_shape(placements_[l], plan.placements[l]);
  placements_ = plan.placements;
  pending_ = false;
}

void EplbController::abandon() {
  pending_ = false;
}

}  // namespace di::parallel
