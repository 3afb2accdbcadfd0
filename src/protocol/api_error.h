#pragma once
// Errors answered to clients, in each protocol's own shape:
//
//   OpenAI     {"error": {"message": "...", "type": "invalid_request_error", "param": "messages", "code": null}}
//   Anthropic  {"type": "error", "error": {"type": "invalid_request_error", "message": "..."}}
//
// One ApiError carries the HTTP status; the `type` strings are derived per protocol from it, so a
// handler decides only *what* went wrong, never how each wire format spells it.
#include <exception>
#include <string>

namespace di::protocol {

struct ApiError {
  int http_status = 400;
  std::string message;
  std::string param;  // the offending field ("messages[2].content"); "" = null
  std::string code;   // OpenAI `code` ("model_not_found"); "" = null

  static ApiError invalid_request(std::string message, std::string param = {});
  static ApiError not_found(std::string message, std::string code = {});
  static ApiError too_large(std::string message);
  static ApiError rate_limited(std::string message);
  static ApiError internal(std::string message);
  static ApiError unavailable(std::string message);  // shutting down / engine overloaded (503)
};

// Thrown by the request parsers; the server catches it and answers the error.
class ApiException : public std::exception {
 public:
  explicit ApiException(ApiError error) : error_(std::move(error)) {}
  const ApiError& error() const { return error_; }
  const char* what() const noexcept override { return error_.message.c_str(); }

 private:
  ApiError error_;
};

[[noreturn]] void throw_invalid(std::string message, std::string param = {});

const char* openai_error_type(int http_status);     // "invalid_request_error", "rate_limit_error", ...
const char* anthropic_error_type(int http_status);  // "invalid_request_error", "not_found_error", ...

std::string openai_error_body(const ApiError& e);
std::string anthropic_error_body(const ApiError& e);

}  // namespace di::protocol
