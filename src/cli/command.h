#pragma once
// Subcommands of the `deepinfer` binary register themselves here, one file per command:
//
//   static di::cli::CommandRegistration reg("generate", "Generate tokens", [](CLI::App& app) {
//     auto opts = std::make_shared<Options>();
//     app.add_option("--model", opts->model, "...");
//     return [opts] { return run_generate(*opts); };   // the exit code
//   });
#include <CLI/CLI.hpp>

#include <exception>
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

// An integer option's lower bound with a readable error ("--block-size: must be an integer >= 1,
// got 0"; CLI::PositiveNumber would print the range up to DBL_MAX).
inline CLI::Validator at_least(long long lo) {
  return CLI::Validator(
      [lo](std::string& s) -> std::string {
        std::size_t used = 0;
        long long v = 0;
        try {
          v = std::stoll(s, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != s.size() || v < lo)
          return "must be an integer >= " + std::to_string(lo) + ", got " + s;
        return {};
      },
      ">= " + std::to_string(lo));
}

struct CommandRegistration {
  CommandRegistration(std::string name, std::string help, Setup setup) {
    command_registry().push_back({std::move(name), std::move(help), std::move(setup)});
  }
};

}  // namespace di::cli
