#include "protocol/api_error.h"

#include <nlohmann/json.hpp>

namespace di::protocol {

ApiError ApiError::invalid_request(std::string message, std::string param) {
  return {400, std::move(message), std::move(param), {}};
}
ApiError ApiError::not_found(std::string message, std::string code) {
  return {404, std::move(message), {}, std::move(code)};
}
ApiError ApiError::too_large(std::string message) {
  return {413, std::move(message), {}, "request_too_large"};
}
ApiError ApiError::rate_limited(std::string message) {
  return {429, std::move(message), {}, "rate_limit_exceeded"};
}
ApiError ApiError::internal(std::string message) { return {500, std::move(message), {}, {}}; }
ApiError ApiError::unavailable(std::string message) {
  return {503, std::move(message), {}, "overloaded"};
}

void throw_invalid(std::string message, std::string param) {
  throw ApiException(ApiError::invalid_request(std::move(message), std::move(param)));
}

const char* openai_error_type(int http_status) {
  switch (http_status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return http_status >= 500 ? "server_error" : "invalid_request_error";
  }
}

const char* anthropic_error_type(int http_status) {
  switch (http_status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503:
    case 529: return "overloaded_error";
    default: return http_status >= 500 ? "api_error" : "invalid_request_error";
  }
}

namespace {
nlohmann::json null_if_empty(const std::string& s) {
  return s.empty() ? nlohmann::json(nullptr) : nlohmann::json(s);
}
}  // namespace

std::string openai_error_body(const ApiError& e) {
  nlohmann::ordered_json j;
  j["error"] = {{"message", e.message},
                {"type", openai_error_type(e.http_status)},
                {"param", null_if_empty(e.param)},
                {"code", null_if_empty(e.code)}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string anthropic_error_body(const ApiError& e) {
  nlohmann::ordered_json j;
  j["type"] = "error";
  j["error"] = {{"type", anthropic_error_type(e.http_status)}, {"message", e.message}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace di::protocol
