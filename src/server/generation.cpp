#include "server/generation.h"

#include <fmt/format.h>

#include <atomic>

#include "core/logging.h"

namespace di::server {

using protocol::ApiError;
using recipe::ParserEvent;
using Clock = std::chrono::steady_clock;

void EventChannel::push(const TokenEvent& e) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(e);
  }
  cv_.notify_one();
}

void EventChannel::pop_all(std::vector<TokenEvent>& out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (queue_.empty()) cv_.wait_for(lock, timeout, [&] { return !queue_.empty(); });
  for (auto& e : queue_) out.push_back(std::move(e));
  queue_.clear();
}

namespace {

RequestId next_request_id() {
  static std::atomic<uint64_t> next{1};
  return RequestId(next.fetch_add(1, std::memory_order_relaxed));
}

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

Generation::Generation(std::shared_ptr<const ServedModel> model, Engine& engine, ServerMetrics& metrics,
                       PreparedRequest prepared, protocol::ResponseMeta meta)
    : model_(std::move(model)),
      engine_(engine),
      metrics_(metrics),
      prepared_(std::move(prepared)),
      meta_(std::move(meta)),
      id_(next_request_id()),
      stop_checker_(prepared_.request.gen.stop) {
  const auto& req = prepared_.request;
  if (req.api == protocol::Api::kCompletions) {
    detok_ = std::make_unique<recipe::IncrementalDetokenizer>(model_->tokenizer,
                                                              recipe::IncrementalDetokenizer::Options{true});
  } else {
    recipe::ParserOptions options = recipe::parser_options_for(*model_->renderer, req.conversation);
    options.parse_tool_calls = req.parse_tool_calls;
    const char* prefix = req.api == protocol::Api::kMessages ? "toolu_" : "call_";
    options.tool_call_ids = [prefix](int) { return protocol::random_id(prefix); };
    in_reasoning_ = options.starts_in_reasoning;
    parser_ = recipe::make_output_parser(model_->family, model_->tokenizer, std::move(options));
  }
  if (req.stream) encoder_ = protocol::make_stream_encoder(req, meta_);
}

Generation::~Generation() {
  if (submitted_ && !done_) engine_.abort(id_);
}

Status Generation::submit() {
  EngineRequest r;
  r.id = id_;
  r.prompt = prepared_.prompt;
  r.sampling = prepared_.request.gen.sampling;
  r.max_tokens = static_cast<int32_t>(prepared_.max_tokens);
  if (!prepared_.request.gen.ignore_eos) r.stop_token_ids = model_->renderer->stop_token_ids();
  std::shared_ptr<EventChannel> channel = channel_;
  Status st = engine_.submit(std::move(r), [channel](const TokenEvent& e) { channel->push(e); });
  submitted_ = st.is_ok();
  return st;
}

void Generation::abort_for_disconnect() {
  if (done_ || aborted_) return;
  aborted_ = true;
  done_ = true;
  if (submitted_) engine_.abort(id_);
  metrics_.count_disconnect();
}

bool Generation::pump(std::chrono::milliseconds timeout, std::string& out) {
  if (encoder_ && !begun_) {
    protocol::Usage usage;
    usage.prompt_tokens = static_cast<int64_t>(prepared_.prompt.size());
    encoder_->begin(usage, out);
  }
  begun_ = true;
  if (done_) return true;
  events_.clear();
  channel_->pop_all(events_, timeout);
  for (const TokenEvent& e : events_) {
    handle(e, out);
    if (done_) break;
  }
  return done_;
}

void Generation::handle(const TokenEvent& e, std::string& out) {
  if (e.finish == EngineFinish::kError) {
    fail(ApiError::internal(e.error.empty() ? "the engine failed this request" : e.error), out);
    return;
  }
  if (e.token >= 0) {
    const auto now = Clock::now();
    if (num_tokens_ == 0) {
      first_token_at_ = now;
      metrics_.observe_ttft(seconds_between(prepared_.arrival, now));
    }
    last_token_at_ = now;
    ++num_tokens_;
    metrics_.add_generated_tokens(1);
    if (!stop_matched_) feed_token(e.token, out);
  }
  if (e.finish != EngineFinish::kNone) finalize(e, out);
}

void Generation::feed_token(int32_t token, std::string& out) {
  if (detok_) {
    std::string text = detok_->push(token);
    if (!text.empty()) on_parser_event(ParserEvent{ParserEvent::Type::kContentDelta, std::move(text)}, out);
    return;
  }
  scratch_.clear();
  parser_->feed(std::span<const recipe::TokenId>(&token, 1), scratch_);
  for (const ParserEvent& pe : scratch_) on_parser_event(pe, out);
  if (in_reasoning_) ++num_reasoning_tokens_;
}

void Generation::on_parser_event(const ParserEvent& e, std::string& out) {
  if (stop_matched_) return;
  using T = ParserEvent::Type;
  if (e.type == T::kReasoningDelta && !e.text.empty()) in_reasoning_ = true;
  if ((e.type == T::kContentDelta && !e.text.empty()) || e.type == T::kToolCallStart) in_reasoning_ = false;
  if (e.type != T::kContentDelta) {
    // A stop string cannot continue across a reasoning block or a tool call.
    flush_stop_checker(out);
    emit(e, out);
    return;
  }
  content_seen_ += e.text;
  StopChecker::Result r = stop_checker_.append(e.text);
  if (!r.text.empty()) emit(ParserEvent{T::kContentDelta, std::move(r.text)}, out);
  if (r.stopped) {
    stop_matched_ = true;
    // The longest stop string starting at the truncation point is the one that matched.
    const size_t at = std::min(r.stop_offset, content_seen_.size());
    for (const auto& s : prepared_.request.gen.stop) {
      if (content_seen_.compare(at, s.size(), s) == 0 && s.size() > builder_.completion().stop_sequence.size()) {
        builder_.completion().stop_sequence = s;
      }
    }
    engine_.finish(id_);
  }
}

void Generation::flush_stop_checker(std::string& out) {
  std::string held = stop_checker_.flush();
  if (!held.empty()) emit(ParserEvent{ParserEvent::Type::kContentDelta, std::move(held)}, out);
}

void Generation::emit(const ParserEvent& e, std::string& out) {
  if (e.type == ParserEvent::Type::kFinish) return;
  builder_.add(e);
  if (encoder_) encoder_->event(e, out);
}

void Generation::finalize(const TokenEvent& e, std::string& out) {
  if (e.finish == EngineFinish::kAbort) {
    if (!aborted_) fail(ApiError::unavailable("the request was aborted (the server is shutting down)"), out);
    done_ = true;
    return;
  }
  recipe::FinishReason reason =
      e.finish == EngineFinish::kLength ? recipe::FinishReason::kLength : recipe::FinishReason::kStop;
  if (!stop_matched_) {
    if (detok_) {
      std::string tail = detok_->flush();
      if (!tail.empty()) on_parser_event(ParserEvent{ParserEvent::Type::kContentDelta, std::move(tail)}, out);
    } else {
      scratch_.clear();
      parser_->finish(reason, scratch_);
      for (const ParserEvent& pe : scratch_) {
        if (pe.type == ParserEvent::Type::kFinish) reason = pe.finish_reason;
        on_parser_event(pe, out);
      }
    }
    if (!stop_matched_) flush_stop_checker(out);
  }
  protocol::Completion& c = builder_.completion();
  c.stop = stop_matched_ ? protocol::StopCause::kStopSequence : protocol::stop_cause(reason, false);
  c.usage.prompt_tokens = e.num_prompt_tokens > 0 ? e.num_prompt_tokens : static_cast<int64_t>(prepared_.prompt.size());
  c.usage.cached_tokens = e.num_cached_tokens;
  c.usage.completion_tokens = e.num_output_tokens > 0 ? e.num_output_tokens : num_tokens_;
  c.usage.reasoning_tokens = std::min(num_reasoning_tokens_, c.usage.completion_tokens);
  metrics_.add_prompt_tokens(c.usage.prompt_tokens);
  metrics_.add_cached_tokens(c.usage.cached_tokens);
  const auto now = Clock::now();
  if (num_tokens_ > 1) metrics_.observe_tpot(seconds_between(first_token_at_, last_token_at_) / double(num_tokens_ - 1));
  metrics_.observe_e2e(seconds_between(prepared_.arrival, now));
  if (encoder_) encoder_->end(c, out);
  done_ = true;
}

void Generation::fail(ApiError err, std::string& out) {
  DI_LOG_WARN("request {} failed: {}", meta_.id, err.message);
  if (encoder_) encoder_->fail(err, out);
  error_ = std::move(err);
  done_ = true;
}

}  // namespace di::server
