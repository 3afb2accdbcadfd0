#pragma once
// The one exception type used at internal boundaries, and the checks that throw it.
//
//   DI_CHECK(n > 0, "expected a positive count, got {}", n);
//
// I/O paths (store, router, HTTP) return Result<T> instead (status.h).
#include <fmt/format.h>

#include <source_location>
#include <stdexcept>
#include <string>

namespace di {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

[[noreturn]] void throw_check_failure(const char* expr, const std::string& message,
                                      const std::source_location& where);

}  // namespace di

#define DI_CHECK(cond, ...)                                                                     \
  do {                                                                                          \
    if (!(cond)) [[unlikely]]                                                                   \
      ::di::throw_check_failure(#cond, ::fmt::format(__VA_ARGS__), std::source_location::current()); \
  } while (0)

#define DI_FAIL(...) \
  ::di::throw_check_failure("", ::fmt::format(__VA_ARGS__), std::source_location::current())
