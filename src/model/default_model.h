#pragma once
// Where the embedded default model (models/deepinfer-demo-code, shipped in the repository) is, for
// `deepinfer serve` and `deepinfer generate` without --model.
#include <string>

#include "core/status.h"

namespace di {

inline constexpr const char* kDefaultModelSubdir = "models/deepinfer-demo-code";

// Looks in order at $DEEPINFER_MODEL, ./models/deepinfer-demo-code, the repository the binary was
// built from (<source>/models/...), and <binary dir>/../../models/...; returns the first directory
// holding a config.json, or a NotFound status listing every place it looked.
Result<std::string> find_default_model_dir();

}  // namespace di
