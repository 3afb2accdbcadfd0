#include "core/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <mutex>

namespace di {

void init_logging() {
  static std::once_flag once;
  std::call_once(once, [] {
    auto logger = spdlog::stderr_color_mt("deepinfer");
    spdlog::set_default_logger(logger);
    spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
    spdlog::set_level(spdlog::level::info);
    if (const char* level = std::getenv("DEEPINFER_LOG")) {
      spdlog::set_level(spdlog::level::from_str(level));
    }
  });
}

}  // namespace di
