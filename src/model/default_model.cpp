#include "model/default_model.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "core/env.h"

namespace di {

Result<std::string> find_default_model_dir() {
  namespace fs = std::filesystem;
  std::vector<fs::path> candidates;
  if (const char* env = di::env::get("DEEPINFER_MODEL"))
    candidates.emplace_back(env);  // set, non-empty
  candidates.push_back(fs::current_path() / kDefaultModelSubdir);
#ifdef DI_SOURCE_ROOT
  candidates.push_back(fs::path(DI_SOURCE_ROOT) / kDefaultModelSubdir);
#endif
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    exe[n] = '\0';
    candidates.push_back(fs::path(exe).parent_path() / "../.." / kDefaultModelSubdir);
  }
  std::string tried;
  for (const auto& c : candidates) {
    std::error_code ec;
    if (fs::exists(c / "config.json", ec)) return fs::weakly_canonical(c, ec).string();
    tried += "\n  " + c.string();
  }
  return make_status(StatusCode::kNotFound,
                     "no default model found; pass --model DIR or set DEEPINFER_MODEL. Looked in:{}",
                     tried);
}

}  // namespace di
