// deepinfer env: the DEEPINFER_* environment variables (core/env.h), what they take and do,
// which are set now, and whether the current environment passes the check every command runs.
#include <fmt/format.h>

#include <memory>
#include <string>

#include "cli/command.h"
#include "core/env.h"

namespace di::cli {
namespace {

struct EnvOptions {
  bool set_only = false;
};

int run_env(const EnvOptions& o) {
  if (!o.set_only) {
    for (const env::Variable& v : env::variables()) {
      fmt::print("{}\n  {}\n  values: {}   unset: {}\n", v.name, v.help,
                 v.values.empty() ? std::string_view("any text") : v.values, v.unset);
    }
    fmt::print("\n");
  }
  const auto set = env::set_variables();
  fmt::print("set now:{}\n", set.empty() ? " none" : "");
  for (const std::string& s : set) fmt::print("  {}\n", s);
  return env::report_environment("deepinfer env") ? 0 : 2;
}

CommandRegistration reg(
    "env",
    "List the DEEPINFER_* environment variables (kernel A/B switches, logging, threads), their "
    "values and defaults, and check the current environment",
    [](CLI::App& app) {
      auto opts = std::make_shared<EnvOptions>();
      app.add_flag("--set", opts->set_only,
                   "only the variables set now, and the check (exit 2 on an invalid value)");
      return [opts] { return run_env(*opts); };
    });

}  // namespace
}  // namespace di::cli
