#pragma once
// Subcommands of the `deepinfer` binary register themselves here, one file per command:
//
//   static di::cli::CommandRegistration reg("generate", "Generate tokens", [](CLI::App& app) {
//     auto opts = std::make_shared<Options>();
//     app.add_option("--model", opts->model, "...");
//     return [opts] { return run_generate(*opts); };   // the exit code
//   });
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace di::cli {

using Runner = std::function<int()>;
using Setup = std::function<Runner(CLI::App&)>;

struct CommandSpec {
  std::string name;
  std::string help;
  Setup setup;
};

std::vector<CommandSpec>& command_registry();

struct CommandRegistration {
  CommandRegistration(std::string name, std::string help, Setup setup) {
    command_registry().push_back({std::move(name), std::move(help), std::move(setup)});
  }
};

}  // namespace di::cli
