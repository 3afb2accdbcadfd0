#include "scheduler/sequence.h"

namespace di {

const char* seq_status_name(SeqStatus status) {
  switch (status) {
    case SeqStatus::kWaiting:
      return "waiting";
    case SeqStatus::kRunning:
      return "running";
    case SeqStatus::kPreempted:
      return "preempted";
    case SeqStatus::kFinished:
      return "finished";
  }
  return "?";
}

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kAbort:
      return "abort";
  }
  return "?";
}

std::vector<TokenId> Sequence::tokens() const {
  std::vector<TokenId> all;
  all.reserve(num_tokens());
  all.insert(all.end(), prompt->begin(), prompt->end());
  all.insert(all.end(), output.begin(), output.end());
  return all;
}

}  // namespace di
