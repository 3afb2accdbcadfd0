#pragma once
// The EPLB flags (issue #8) shared by `deepinfer serve` and `deepinfer generate`.
#include <CLI/CLI.hpp>

#include "engine/eplb_options.h"

namespace di::cli {

inline void add_eplb_flags(CLI::App& app, EplbOptions* o) {
  app.add_flag("--eplb", o->enabled,
               "Expert-parallel load balancing for MoE models: count tokens per expert over a "
               "window of steps (prefill and decode steps separately), keep redundant replicas "
               "of hot experts and re-place experts every period, between steps, without "
               "stopping service. Outputs do not change (replicas hold identical weights). "
               "Off by default");
  app.add_option("--ep-ranks", o->ep_ranks,
                 "EPLB: simulated expert-parallel ranks the placement is planned for (this "
                 "device holds every rank's slots; with 1 rank no expert gets a second replica)")
      ->capture_default_str();
  auto phase = [&app](parallel::EplbConfig* c, const std::string& name) {
    app.add_option("--eplb-redundant-" + name, c->redundant_per_rank,
                   "EPLB: redundant expert slots per rank for " + name +
                       " (the device holds the larger of the prefill and decode values)")
        ->capture_default_str();
    app.add_option("--eplb-window-" + name, c->window_steps,
                   "EPLB: " + name + " load statistics cover this many recent " + name + " steps")
        ->capture_default_str();
    app.add_option("--eplb-period-" + name, c->period_steps,
                   "EPLB: re-plan the placement every this many " + name + " steps")
        ->capture_default_str();
    app.add_option("--eplb-bucket-" + name, c->steps_per_bucket,
                   "EPLB: " + name +
                       " window granularity in steps; counts are read from the "
                       "device once per bucket (the window must be a multiple)")
        ->capture_default_str();
    app.add_option("--eplb-min-gain-" + name, c->min_gain,
                   "EPLB: re-place a layer only if its moe_lb (max/mean rank load) drops by at "
                   "least this much")
        ->capture_default_str();
  };
  phase(&o->prefill, "prefill");
  phase(&o->decode, "decode");
}

}  // namespace di::cli
