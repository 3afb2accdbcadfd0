#pragma once
// Hands out requests in dataset order, except that a session's turn k+1 is released only after
// its turn k has completed (its prompt extends turn k's, so sending it earlier would both break
// the conversation order and defeat the prefix cache). Single-turn requests are sessions of one.
//
// Thread-safe: workers block in take() until a request is ready or none is left.
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

namespace di::bench {

class SessionQueue {
 public:
  // session_of[i] = session of request i. Within a session, requests are turns in index order.
  explicit SessionQueue(std::vector<int32_t> session_of);

  // Non-blocking: the first pending request whose session has nothing in flight.
  std::optional<size_t> try_take();
  // Blocking: waits until a request is ready; nullopt when every request has been taken.
  std::optional<size_t> take();
  void complete(size_t request_idx);

  size_t num_taken() const;
  size_t num_completed() const;

 private:
  std::optional<size_t> try_take_locked();

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int32_t> session_of_;
  std::vector<size_t> pending_;     // request indices not yet taken, in order
  std::vector<bool> session_busy_;  // a turn of this session is in flight
  std::vector<bool> taken_;
  size_t num_taken_ = 0;
  size_t num_completed_ = 0;
};

}  // namespace di::bench
