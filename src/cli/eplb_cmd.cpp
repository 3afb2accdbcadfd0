// deepinfer eplb-sim: expert load balancing on a synthetic Zipf routing trace
// (parallel/eplb_sim.h).
#include <fmt/format.h>

#include <memory>

#include "cli/command.h"
#include "parallel/eplb_sim.h"

namespace di::cli {
namespace {

int run_eplb_sim(const parallel::EplbSimOptions& o) {
  const auto layers = parallel::simulate_eplb(o);
  fmt::print(
      "eplb-sim: {} experts top-{}, {} ranks, {} redundant slot(s) per rank, Zipf s={}, {} tokens "
      "per trace, {} layers, seed {}\n",
      o.num_experts, o.top_k, o.num_ranks, o.redundant_per_rank, o.zipf_s, o.num_tokens,
      o.num_layers, o.seed);
  fmt::print(
      "moe_lb = max rank load / mean rank load; 'after' is planned on one trace and "
      "measured on a fresh one\n");
  fmt::print("{:>5} {:>8} {:>14} {:>14} {:>14} {:>9} {:>9}\n", "layer", "hottest", "before (RR)",
             "after (window)", "after (fresh)", "max reps", "plan ms");
  double sum_before = 0, sum_after = 0;
  for (size_t l = 0; l < layers.size(); ++l) {
    const auto& r = layers[l];
    fmt::print("{:>5} {:>7.1f}% {:>14.3f} {:>14.3f} {:>14.3f} {:>9} {:>9.3f}\n", l,
               100.0 * r.hottest_share, r.moe_lb_before, r.moe_lb_window, r.moe_lb_after,
               r.max_replicas, r.plan_ms);
    sum_before += r.moe_lb_before;
    sum_after += r.moe_lb_after;
  }
  const double n = static_cast<double>(layers.size());
  fmt::print("mean moe_lb: before {:.3f}, after {:.3f} (MoE step time x{:.2f})\n", sum_before / n,
             sum_after / n, sum_after / sum_before);
  return 0;
}

CommandRegistration reg(
    "eplb-sim", "Expert load balancing (EPLB) on a synthetic skewed trace", [](CLI::App& app) {
      auto o = std::make_shared<parallel::EplbSimOptions>();
      app.add_option("--experts", o->num_experts, "Logical experts per layer")
          ->capture_default_str();
      app.add_option("--ranks", o->num_ranks, "EP size (GPUs)")->capture_default_str();
      app.add_option("--redundant", o->redundant_per_rank, "Redundant expert slots per rank")
          ->capture_default_str();
      app.add_option("--top-k", o->top_k, "Experts per token")->capture_default_str();
      app.add_option("--zipf", o->zipf_s, "Zipf exponent of expert popularity")
          ->capture_default_str();
      app.add_option("--tokens", o->num_tokens, "Tokens per trace")->capture_default_str();
      app.add_option("--layers", o->num_layers, "MoE layers")->capture_default_str();
      app.add_option("--seed", o->seed, "Trace seed")->capture_default_str();
      return [o] { return run_eplb_sim(*o); };
    });

}  // namespace
}  // namespace di::cli
