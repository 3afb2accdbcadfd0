#include "model/model.h"

#include <fmt/format.h>

#include "core/logging.h"
#include "model/architectures.h"
#include "model/weight_loader.h"
#include "tensor/dtype.h"

namespace di {

std::unique_ptr<Model> load_model(const std::string& model_dir, Backend& backend,
                                  const LoadOptions& options) {
  ModelConfig config = load_model_config(model_dir).value();
  Checkpoint ck = Checkpoint::open(model_dir).value();
  // Refuse before allocating what cannot fit (on the CPU the weights become f32: twice a bf16
  // checkpoint's size), rather than fail or be killed halfway through the load.
  const int64_t need = min_loaded_weight_bytes(ck, backend);
  const int64_t have = backend.available_memory_bytes();
  if (have >= 0 && need > have) {
    DI_FAIL(
        "{}: the weights of this {} checkpoint need at least {:.1f} GB on the {} backend (as {}), "
        "but only {:.1f} GB is available{}",
        model_dir, arch_name(config.arch), static_cast<double>(need) / 1e9, backend.name(),
        dtype_name(backend.compute_dtype()), static_cast<double>(have) / 1e9,
        backend.device() == Device::kCPU ? " (MemAvailable)" : " on the device");
  }
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
