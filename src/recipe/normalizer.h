#pragma once
// tokenizer.json "normalizer": null, Sequence, NFC, NFD. Applied to the text between added tokens
// (and to the content of added tokens marked `normalized` before matching them).
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace di::recipe {

class Normalizer {
 public:
  static Result<Normalizer> from_json(const nlohmann::json& node);

  bool is_identity() const { return steps_.empty(); }
  std::string apply(std::string_view text) const;

 private:
  enum class Step { kNfc, kNfd };
  static Status add(const nlohmann::json& node, std::vector<Step>& steps);
  std::vector<Step> steps_;
};

}  // namespace di::recipe
