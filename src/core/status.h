#pragma once
// Status and Result<T> for I/O paths, where failure is an expected outcome.
#include <fmt/format.h>

#include <optional>
#include <string>
#include <utility>
#include <variant>

#include "core/error.h"

namespace di {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kAlreadyExists,
  kOutOfRange,
  kResourceExhausted,
  kUnavailable,
  kDataLoss,
  kUnimplemented,
  kInternal,
  kCancelled,
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }
  bool is_ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename... Args>
Status make_status(StatusCode code, fmt::format_string<Args...> f, Args&&... args) {
  return Status(code, fmt::format(f, std::forward<Args>(args)...));
}

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    DI_CHECK(!std::get<Status>(v_).is_ok(), "a Result holding a Status must hold an error");
  }

  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & {
    if (!is_ok()) throw Error(std::get<Status>(v_).to_string());
    return std::get<T>(v_);
  }
  const T& value() const& {
    if (!is_ok()) throw Error(std::get<Status>(v_).to_string());
    return std::get<T>(v_);
  }
  T&& value() && {
    if (!is_ok()) throw Error(std::get<Status>(v_).to_string());
    return std::get<T>(std::move(v_));
  }
  T* operator->() { return &value(); }
  T& operator*() { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace di

#define DI_RETURN_IF_ERROR(expr)         \
  do {                                   \
    ::di::Status di_status_ = (expr);    \
    if (!di_status_.is_ok()) return di_status_; \
  } while (0)
