#include "recipe/normalizer.h"

#include <nlohmann/json.hpp>

#include "recipe/unicode.h"

namespace di::recipe {

Status Normalizer::add(const nlohmann::json& node, std::vector<Step>& steps) {
  if (node.is_null()) return Status::ok();
  const std::string type = node.value("type", "");
  if (type == "Sequence") {
    for (const auto& child : node.at("normalizers")) DI_RETURN_IF_ERROR(add(child, steps));
  } else if (type == "NFC") {
    steps.push_back(Step::kNfc);
  } else if (type == "NFD") {
    steps.push_back(Step::kNfd);
  } else {
    return make_status(StatusCode::kUnimplemented, "unsupported normalizer type {:?}", type);
  }
  return Status::ok();
}

Result<Normalizer> Normalizer::from_json(const nlohmann::json& node) {
  Normalizer n;
  try {
    DI_RETURN_IF_ERROR(add(node, n.steps_));
  } catch (const nlohmann::json::exception& e) {
    return make_status(StatusCode::kInvalidArgument, "bad normalizer: {}", e.what());
  }
  return n;
}

std::string Normalizer::apply(std::string_view text) const {
  std::string out(text);
  for (Step step : steps_) out = step == Step::kNfc ? unicode::nfc(out) : unicode::nfd(out);
  return out;
}

}  // namespace di::recipe
