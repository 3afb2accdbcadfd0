#include "bench/openai_client.h"

#include <httplib.h>

#include <algorithm>

#include "core/error.h"

namespace di::bench {

using nlohmann::json;

PromptFormat format_of_endpoint(const std::string& endpoint) {
  return endpoint.find("chat") != std::string::npos ? PromptFormat::kMessages : PromptFormat::kText;
}

json build_request_body(const BenchRequest& request, const ClientOptions& options) {
  json body;
  body["model"] = options.model;
  if (format_of_endpoint(options.endpoint) == PromptFormat::kMessages) {
    body["messages"] = request.messages;
  } else {
    body["prompt"] = request.prompt;
  }
  body["max_tokens"] = request.max_tokens;
  body["temperature"] = options.temperature;
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  if (options.ignore_eos) body["ignore_eos"] = true;
  for (const auto& [key, value] : options.extra_body.items()) body[key] = value;
  return body;
}

// ---- StreamAccumulator
// ---------------------------------------------------------------------------

void StreamAccumulator::fail(std::string type, std::string message) {
  if (failed_) return;  // the first error is the one that counts
  failed_ = true;
  record_.error_type = std::move(type);
  record_.error_message = std::move(message);
}

namespace {

// The text a choice carries: completions put it in "text", chat in "delta" (content, or the
// reasoning fields some servers stream separately; all of them are output tokens).
std::string choice_text(const json& choice) {
  std::string out;
  auto add = [&out](const json& obj, const char* key) {
    auto it = obj.find(key);
    if (it != obj.end() && it->is_string()) out += it->get<std::string>();
  };
  add(choice, "text");
  if (auto d = choice.find("delta"); d != choice.end() && d->is_object()) {
    add(*d, "content");
    add(*d, "reasoning_content");
    add(*d, "reasoning");
  }
  return out;
}

int32_t int_or(const json& obj, const char* key, int32_t fallback) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_number_integer() ? it->get<int32_t>() : fallback;
}

}  // namespace

void StreamAccumulator::on_event(const SseEvent& event, double t_s) {
  if (event.data == "[DONE]") {
    done_ = true;
    return;
  }
  if (done_) return;
  json j;
  try {
    j = json::parse(event.data);
  } catch (const json::exception&) {
    fail("bad_json", event.data.substr(0, 200));
    return;
  }
  if (!j.is_object()) {
    fail("bad_json", event.data.substr(0, 200));
    return;
  }
  if (auto e = j.find("error"); e != j.end() && !e->is_null()) {
    fail("stream_error", e->is_object() ? e->value("message", e->dump()) : e->dump());
    return;
  }
  if (auto choices = j.find("choices"); choices != j.end() && choices->is_array()) {
    bool has_text = false;
    for (const json& c : *choices) {
      if (!c.is_object()) continue;
      std::string text = choice_text(c);
      if (!text.empty()) {
        has_text = true;
        record_.output_text += text;
      }
      if (auto fr = c.find("finish_reason"); fr != c.end() && fr->is_string()) {
        record_.finish_reason = fr->get<std::string>();
      }
    }
    if (has_text) record_.chunk_times.push_back(t_s);
  }
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    record_.usage_prompt_tokens = int_or(*u, "prompt_tokens", record_.usage_prompt_tokens);
    record_.usage_completion_tokens =
        int_or(*u, "completion_tokens", record_.usage_completion_tokens);
    if (auto d = u->find("prompt_tokens_details"); d != u->end() && d->is_object()) {
      record_.usage_cached_tokens = int_or(*d, "cached_tokens", record_.usage_cached_tokens);
    }
  }
}

void StreamAccumulator::finish(double t_s) {
  record_.end_s = t_s;
  if (!failed_ && !done_ && record_.finish_reason.empty()) {
    fail("incomplete_stream", "the stream ended without [DONE] or a finish_reason");
  }
  if (!failed_ && record_.chunk_times.empty() && record_.usage_completion_tokens <= 0 &&
      record_.max_tokens > 0) {
    fail("no_output", "no output text and no completion tokens in usage");
  }
  if (record_.usage_completion_tokens >= 0) {
    record_.output_tokens = record_.usage_completion_tokens;
    record_.output_tokens_from_usage = true;
  }
  record_.success = !failed_;
}

// ---- OpenAiClient
// --------------------------------------------------------------------------------

struct OpenAiClient::Impl {
  explicit Impl(const std::string& base_url) : client(base_url) {}
  httplib::Client client;
};

OpenAiClient::OpenAiClient(ClientOptions options, Clock::time_point origin)
    : options_(std::move(options)), origin_(origin) {
  impl_ = std::make_unique<Impl>(options_.base_url);
  DI_CHECK(impl_->client.is_valid(), "cannot use base URL '{}' (http://host:port expected)",
           options_.base_url);
  impl_->client.set_keep_alive(true);
  impl_->client.set_connection_timeout(10, 0);
  const auto to = std::chrono::duration<double>(options_.timeout_s);
  impl_->client.set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(to));
  impl_->client.set_write_timeout(std::chrono::duration_cast<std::chrono::microseconds>(to));
}

OpenAiClient::~OpenAiClient() = default;

double OpenAiClient::now_s() const {
  return std::chrono::duration<double>(Clock::now() - origin_).count();
}

void OpenAiClient::send(const BenchRequest& request, RequestRecord& record) {
  record.session_idx = request.session_idx;
  record.turn_idx = request.turn_idx;
  record.dataset_prompt_tokens = request.prompt_tokens;
  record.max_tokens = request.max_tokens;

  httplib::Request req;
  req.method = "POST";
  req.path = options_.endpoint;
  req.body = build_request_body(request, options_).dump();
  req.headers.emplace("Content-Type", "application/json");
  req.headers.emplace("Accept", "text/event-stream");
  if (!options_.api_key.empty()) req.headers.emplace("Authorization", "Bearer " + options_.api_key);

  StreamAccumulator acc(record);
  SseParser parser([&](const SseEvent& e) { acc.on_event(e, now_s()); });
  int status = 0;
  std::string error_body;
  req.response_handler = [&](const httplib::Response& res) {
    status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    if (status == 200) {
      parser.feed(std::string_view(data, len));
    } else if (error_body.size() < 2000) {
      error_body.append(data, std::min<size_t>(len, 2000 - error_body.size()));
    }
    return true;
  };

  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  record.start_s = now_s();
  const bool ok = impl_->client.send(req, res, err);
  const double end = now_s();
  if (!ok) {
    record.end_s = end;
    record.success = false;
    if (err == httplib::Error::Read && end - record.start_s >= options_.timeout_s * 0.99) {
      record.error_type = "timeout";
    } else if (err == httplib::Error::Connection || err == httplib::Error::ConnectionTimeout) {
      record.error_type = "connect";
    } else {
      record.error_type = "http_client_" + httplib::to_string(err);
      std::replace(record.error_type.begin(), record.error_type.end(), ' ', '_');
    }
    record.error_message = httplib::to_string(err);
    return;
  }
  if (status != 200) {
    record.end_s = end;
    record.success = false;
    record.error_type = "http_" + std::to_string(status);
    record.error_message = error_body;
    return;
  }
  parser.finish();
  acc.finish(end);
}

Result<std::string> http_get(const std::string& base_url, const std::string& path,
                             double timeout_s) {
  httplib::Client client(base_url);
  if (!client.is_valid()) {
    return make_status(StatusCode::kInvalidArgument, "bad base URL '{}'", base_url);
  }
  const auto to = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::duration<double>(timeout_s));
  client.set_connection_timeout(to);
  client.set_read_timeout(to);
  auto res = client.Get(path);
  if (!res) {
    return make_status(StatusCode::kUnavailable, "GET {}{}: {}", base_url, path,
                       httplib::to_string(res.error()));
  }
  if (res->status != 200) {
    return make_status(StatusCode::kUnavailable, "GET {}{}: HTTP {}", base_url, path, res->status);
  }
  return res->body;
}

}  // namespace di::bench
