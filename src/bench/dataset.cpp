#include "bench/dataset.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <random>

#include "bench/stats.h"
#include "core/error.h"

namespace di::bench {

using nlohmann::json;

std::string flatten_messages(const json& messages) {
  std::string out;
  bool first = true;
  for (const json& m : messages) {
    if (!first) out += kTurnSeparator;
    first = false;
    const json& c = m.at("content");
    if (c.is_string()) {
      out += c.get<std::string>();
    } else {  // OpenAI content parts: the text parts, in order
      for (const json& part : c) {
        if (part.value("type", "") == "text") out += part.value("text", "");
      }
    }
  }
  return out;
}

namespace {

json message(const char* role, std::string content) {
  return json{{"role", role}, {"content", std::move(content)}};
}

// Measures the request's prompt length and fills `prompt` for the text format.
void finalize(BenchRequest& r, PromptFormat format, const PromptTextBuilder& text) {
  if (format == PromptFormat::kText) {
    r.prompt = flatten_messages(r.messages);
    r.prompt_tokens = text.count_tokens(r.prompt);
  } else {
    int32_t total = 0;
    for (const json& m : r.messages) {
      const json& c = m.at("content");
      total += text.count_tokens(c.is_string() ? c.get<std::string>() : flatten_messages({m}));
    }
    r.prompt_tokens = total;
  }
}

int32_t sample_len(int32_t len, double ratio, std::mt19937_64& rng) {
  if (ratio <= 0) return len;
  const auto lo = static_cast<int32_t>(std::floor(len * (1.0 - ratio)));
  const auto hi = static_cast<int32_t>(std::ceil(len * (1.0 + ratio)));
  return std::uniform_int_distribution<int32_t>(std::max(lo, 1), std::max(hi, 1))(rng);
}

Dataset build_random(const DatasetOptions& o, PromptTextBuilder& text) {
  DI_CHECK(o.input_len >= 1, "--input-len must be >= 1, got {}", o.input_len);
  DI_CHECK(o.range_ratio >= 0 && o.range_ratio < 1, "--range-ratio must be in [0, 1), got {}",
           o.range_ratio);
  DI_CHECK(o.shared_prefix_len >= 0, "--shared-prefix-len must be >= 0");
  Dataset d;
  std::mt19937_64 rng(o.seed ^ 0x9e3779b97f4a7c15ull);
  const std::string prefix = text.text_of_tokens(o.shared_prefix_len);
  for (int64_t i = 0; i < o.num_requests; ++i) {
    BenchRequest r;
    r.session_idx = static_cast<int32_t>(i);
    const int32_t in_len = sample_len(o.input_len, o.range_ratio, rng);
    r.max_tokens = sample_len(o.output_len, o.range_ratio, rng);
    const int32_t target = o.shared_prefix_len + in_len;
    // The prefix's last token may merge with the body's first: adjust the body length until the
    // whole prompt has the target count (a few tries; otherwise the measured length is reported).
    std::string content;
    int32_t body_len = in_len;
    for (int attempt = 0; attempt < 8 && body_len >= 1; ++attempt) {
      content = prefix + text.text_of_tokens(body_len);
      const int32_t got = text.count_tokens(content);
      if (got == target) break;
      body_len += target - got;
    }
    r.messages = json::array({message("user", std::move(content))});
    finalize(r, o.format, text);
    ++d.num_length_checked;
    if (r.prompt_tokens == target) ++d.num_exact_length;
    d.requests.push_back(std::move(r));
  }
  d.num_sessions = static_cast<int32_t>(o.num_requests);
  return d;
}

// multiturn and agent: sessions whose every turn extends the previous one.
Dataset build_sessions(const DatasetOptions& o, PromptTextBuilder& text, bool agent) {
  const int32_t turns = o.turns >= 0 ? o.turns : (agent ? 8 : 4);
  const int32_t context_len = o.context_len >= 0 ? o.context_len : (agent ? 16384 : 512);
  const int32_t turn_len = o.turn_len >= 0 ? o.turn_len : (agent ? 1024 : 128);
  DI_CHECK(turns >= 1, "--turns must be >= 1, got {}", turns);
  DI_CHECK(turn_len >= 1, "--turn-len must be >= 1, got {}", turn_len);
  DI_CHECK(o.output_len >= 1, "--output-len must be >= 1, got {}", o.output_len);
  Dataset d;
  std::mt19937_64 rng(o.seed ^ 0xc2b2ae3d27d4eb4full);
  const auto num_sessions = static_cast<int32_t>((o.num_requests + turns - 1) / turns);
  int64_t left = o.num_requests;
  for (int32_t s = 0; s < num_sessions; ++s) {
    json history = json::array();
    if (context_len > 0) history.push_back(message("system", text.text_of_tokens(context_len)));
    for (int32_t t = 0; t < turns && left > 0; ++t, --left) {
      if (t > 0) {  // the reply to the previous turn (synthetic: the same bytes on every run)
        history.push_back(message("assistant", text.text_of_tokens(o.output_len)));
      }
      // Agents' tool results vary a lot in size; a chat user's messages less so.
      const int32_t new_len = agent ? sample_len(turn_len, 0.5, rng) : turn_len;
      history.push_back(message("user", text.text_of_tokens(new_len)));
      BenchRequest r;
      r.session_idx = s;
      r.turn_idx = t;
      r.messages = history;
      r.max_tokens = o.output_len;
      finalize(r, o.format, text);
      d.requests.push_back(std::move(r));
    }
  }
  d.num_sessions = num_sessions;
  d.options["turns"] = turns;
  d.options["context_len"] = context_len;
  d.options["turn_len"] = turn_len;
  return d;
}

Dataset build_jsonl(const DatasetOptions& o, PromptTextBuilder& text) {
  DI_CHECK(!o.path.empty(), "the jsonl dataset needs --dataset-path FILE");
  std::ifstream in(o.path);
  DI_CHECK(in.good(), "cannot open --dataset-path '{}'", o.path);
  Dataset d;
  std::map<std::string, int32_t> session_ids;
  std::map<int32_t, int32_t> turns_seen;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line) &&
         (o.num_requests <= 0 || static_cast<int64_t>(d.requests.size()) < o.num_requests)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      DI_FAIL("{}:{}: not JSON: {}", o.path, line_no, e.what());
    }
    DI_CHECK(j.is_object(), "{}:{}: expected an object", o.path, line_no);
    BenchRequest r;
    if (j.contains("messages")) {
      DI_CHECK(j["messages"].is_array() && !j["messages"].empty(),
               "{}:{}: \"messages\" must be a non-empty array", o.path, line_no);
      for (const json& m : j["messages"]) {
        DI_CHECK(m.is_object() && m.contains("role") && m.contains("content") &&
                     (m["content"].is_string() || m["content"].is_array()),
                 "{}:{}: each message needs \"role\" and string (or parts) \"content\"", o.path,
                 line_no);
      }
      r.messages = j["messages"];
    } else if (j.contains("prompt") && j["prompt"].is_string()) {
      r.messages = json::array({message("user", j["prompt"].get<std::string>())});
    } else {
      DI_FAIL("{}:{}: needs \"prompt\" (string) or \"messages\" (array)", o.path, line_no);
    }
    r.max_tokens = o.output_len;
    if (j.contains("max_tokens")) {
      DI_CHECK(j["max_tokens"].is_number_integer() && j["max_tokens"].get<int64_t>() >= 1,
               "{}:{}: \"max_tokens\" must be a positive integer", o.path, line_no);
      r.max_tokens = j["max_tokens"].get<int32_t>();
    }
    if (j.contains("session_id")) {
      const std::string sid =
          j["session_id"].is_string() ? j["session_id"].get<std::string>() : j["session_id"].dump();
      auto [it, inserted] = session_ids.emplace(sid, d.num_sessions);
      if (inserted) ++d.num_sessions;
      r.session_idx = it->second;
    } else {
      r.session_idx = d.num_sessions++;
    }
    r.turn_idx = turns_seen[r.session_idx]++;
    // A prompt line under the chat format: send exactly that text as the one user message.
    if (o.format == PromptFormat::kText && j.contains("prompt") && !j.contains("messages")) {
      r.prompt = j["prompt"].get<std::string>();
      r.prompt_tokens = text.count_tokens(r.prompt);
    } else {
      finalize(r, o.format, text);
    }
    d.requests.push_back(std::move(r));
  }
  DI_CHECK(!d.requests.empty(), "{}: no requests", o.path);
  d.options["path"] = o.path;
  return d;
}

}  // namespace

Dataset build_dataset(const DatasetOptions& o, PromptTextBuilder& text) {
  DI_CHECK(o.num_requests >= 1 || o.name == "jsonl", "--num-prompts must be >= 1, got {}",
           o.num_requests);
  Dataset d;
  if (o.name == "random") {
    d = build_random(o, text);
    d.options["input_len"] = o.input_len;
    d.options["range_ratio"] = o.range_ratio;
    d.options["shared_prefix_len"] = o.shared_prefix_len;
  } else if (o.name == "multiturn") {
    d = build_sessions(o, text, /*agent=*/false);
  } else if (o.name == "agent") {
    d = build_sessions(o, text, /*agent=*/true);
  } else if (o.name == "jsonl") {
    d = build_jsonl(o, text);
  } else {
    DI_FAIL("unknown dataset '{}' (random, multiturn, agent, jsonl)", o.name);
  }
  d.name = o.name;
  d.format = o.format;
  d.options["output_len"] = o.output_len;
  d.options["seed"] = o.seed;
  return d;
}

json Dataset::describe() const {
  std::vector<double> lens, outs;
  for (const BenchRequest& r : requests) {
    lens.push_back(r.prompt_tokens);
    outs.push_back(r.max_tokens);
  }
  json j;
  j["name"] = name;
  j["format"] = format == PromptFormat::kText ? "text" : "messages";
  j["options"] = options;
  j["num_requests"] = requests.size();
  j["num_sessions"] = num_sessions;
  j["prompt_tokens"] = to_json(summarize(lens));
  j["max_tokens"] = to_json(summarize(outs));
  if (num_length_checked > 0) {
    j["exact_length_prompts"] = num_exact_length;
    j["length_checked_prompts"] = num_length_checked;
  }
  return j;
}

}  // namespace di::bench
