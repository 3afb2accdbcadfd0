#include "model/model.h"

#include <fmt/format.h>

#include "core/logging.h"
#include "model/architectures.h"
#include "model/weight_loader.h"

namespace di {

std::unique_ptr<Model> load_model(const std::string& model_dir, Backend& backend,
                                  const LoadOptions& options) {
  ModelConfig config = load_model_config(model_dir).value();
  Checkpoint ck = Checkpoint::open(model_dir).value();
  std::unique_ptr<Model> model;
  try {
    model = config.is_mla() ? make_mla_model(config, backend, ck, options)
                            : make_gqa_model(config, backend, ck, options);
  } catch (const Error& e) {
    throw Error(fmt::format("loading {} from {}: {}", arch_name(config.arch), model_dir, e.what()));
  }
  std::vector<std::string> unused = ck.unused();
  if (!unused.empty()) {
    std::string list;
    for (size_t i = 0; i < unused.size() && i < 8; ++i)
      list += fmt::format("{}'{}' ({})", i ? ", " : "", unused[i], ck.file_of(unused[i]));
    DI_FAIL("{}: {} unexpected tensor(s) not used by {}: {}{}", model_dir, unused.size(),
            arch_name(config.arch), list, unused.size() > 8 ? ", ..." : "");
  }
  return model;
}

std::unique_ptr<Model> make_random_model(const ModelConfig& config, Backend& backend,
                                         const RandomWeights& random, LoadOptions options) {
  const Checkpoint empty;  // has() is false for every name in random mode
  options.random = &random;
  return config.is_mla() ? make_mla_model(config, backend, empty, options)
                         : make_gqa_model(config, backend, empty, options);
}

}  // namespace di
