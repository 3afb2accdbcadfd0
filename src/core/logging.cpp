#include "core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <mutex>

#include "core/env.h"
#include "core/error.h"

namespace di {

void init_logging() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto logger = spdlog::stderr_color_mt("deepinfer");
    spdlog::set_default_logger(logger);
    spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
    spdlog::set_level(spdlog::level::info);
    // An invalid DEEPINFER_LOG leaves the level at info: the CLI's environment check
    // (env::check_environment) reports it and exits before any work.
    const char* level = nullptr;
    try {
      level = env::get("DEEPINFER_LOG");
    } catch (const Error&) {
    }
    if (level != nullptr) spdlog::set_level(spdlog::level::from_str(level));
  });
}

}  // namespace di
