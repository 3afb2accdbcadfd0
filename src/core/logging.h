#pragma once
// Logging through spdlog. One process-wide logger; the level comes from DEEPINFER_LOG
// (trace, debug, info, warn, error, off) and defaults to info.
#include <spdlog/spdlog.h>

namespace di {

void init_logging();  // idempotent; reads DEEPINFER_LOG

}  // namespace di

#define DI_LOG_DEBUG(...) SPDLOG_DEBUG(__VA_ARGS__)
#define DI_LOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define DI_LOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define DI_LOG_ERROR(...) ::spdlog::error(__VA_ARGS__)
