#include <algorithm>
#include <exception>
#include <map>

#include "cli/command.h"
#include "core/env.h"
#include "core/error.h"
#include "core/logging.h"

namespace di::cli {

std::vector<CommandSpec>& command_registry() {
  static std::vector<CommandSpec> registry;
  return registry;
}

}  // namespace di::cli

int main(int argc, char** argv) {
  di::init_logging();
  CLI::App app{"deepinfer: an LLM serving engine for DeepSeek-style models (CPU and CUDA)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "deepinfer 0.1.0");
  app.footer(
      "Environment: DEEPINFER_* variables (kernel A/B switches, DEEPINFER_LOG, DEEPINFER_THREADS, "
      "DEEPINFER_MODEL); `deepinfer env` lists them with their values and defaults.");
  auto specs = di::cli::command_registry();
  std::sort(specs.begin(), specs.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  std::map<CLI::App*, di::cli::Runner> runners;
  for (const auto& spec : specs) {
    CLI::App* sub = app.add_subcommand(spec.name, spec.help);
    runners[sub] = spec.setup(*sub);
  }
  CLI11_PARSE(app, argc, argv);
  // DEEPINFER_* variables (core/env.h): an invalid value stops here, before any work, rather than
  // at the first kernel that reads it; an unknown name (a misspelt switch) is a warning. `env`
  // itself reports them.
  if (!app.got_subcommand("env") && !di::env::report_environment("deepinfer")) return 2;
  try {
    for (auto& [sub, run] : runners) {
      if (sub->parsed()) return run();
    }
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
  return 2;
}
