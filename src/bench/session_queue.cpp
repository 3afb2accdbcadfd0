#include "bench/session_queue.h"

#include <algorithm>

#include "core/error.h"

namespace di::bench {

SessionQueue::SessionQueue(std::vector<int32_t> session_of) : session_of_(std::move(session_of)) {
  int32_t max_session = -1;
  for (int32_t s : session_of_) {
    DI_CHECK(s >= 0, "session index must be >= 0, got {}", s);
    max_session = std::max(max_session, s);
  }
  session_busy_.assign(static_cast<size_t>(max_session + 1), false);
  taken_.assign(session_of_.size(), false);
  pending_.resize(session_of_.size());
  for (size_t i = 0; i < pending_.size(); ++i) pending_[i] = i;
}

std::optional<size_t> SessionQueue::try_take_locked() {
  // A session's earlier turn always precedes its later turns in `pending_`, so skipping a busy
  // session's entries keeps its turns in order. Scanning is linear in the blocked prefix, which
  // is at most the number of sessions in flight.
  std::vector<bool> seen(session_busy_.size(), false);
  for (auto it = pending_.begin(); it != pending_.end(); ++it) {
    const auto s = static_cast<size_t>(session_of_[*it]);
    if (session_busy_[s] || seen[s]) {
      seen[s] = true;
      continue;
    }
    const size_t idx = *it;
    pending_.erase(it);
    session_busy_[s] = true;
    taken_[idx] = true;
    ++num_taken_;
    return idx;
  }
  return std::nullopt;
}

std::optional<size_t> SessionQueue::try_take() {
  std::lock_guard lock(mu_);
  return try_take_locked();
}

std::optional<size_t> SessionQueue::take() {
  std::unique_lock lock(mu_);
  while (true) {
    if (pending_.empty()) return std::nullopt;
    if (auto idx = try_take_locked()) return idx;
    cv_.wait(lock);
  }
}

void SessionQueue::complete(size_t request_idx) {
  {
    std::lock_guard lock(mu_);
    DI_CHECK(request_idx < taken_.size() && taken_[request_idx],
             "complete({}) of a request that was not taken", request_idx);
    const auto s = static_cast<size_t>(session_of_[request_idx]);
    DI_CHECK(session_busy_[s], "complete({}): session {} has nothing in flight", request_idx, s);
    session_busy_[s] = false;
    ++num_completed_;
  }
  cv_.notify_all();
}

size_t SessionQueue::num_taken() const {
  std::lock_guard lock(mu_);
  return num_taken_;
}

size_t SessionQueue::num_completed() const {
  std::lock_guard lock(mu_);
  return num_completed_;
}

}  // namespace di::bench
