#include "backend/backend.h"

#include "core/error.h"

namespace di {

void Backend::moe_count_experts(const Tensor&, Tensor&) {
  DI_FAIL("backend '{}' does not implement moe_count_experts", name());
}
void Backend::moe_map_replicas(const Tensor&, const Tensor&, const Tensor&, Tensor&) {
  DI_FAIL("backend '{}' does not implement moe_map_replicas", name());
}
void Backend::copy_rows(const Tensor&, int64_t, Tensor&, int64_t, int64_t) {
  DI_FAIL("backend '{}' does not implement copy_rows", name());
}

#ifdef DI_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend();
#endif

std::unique_ptr<Backend> make_backend(const std::string& name) {
  if (name == "cpu") return make_cpu_backend();
#ifdef DI_HAVE_CUDA
  if (name == "cuda") return make_cuda_backend();
  DI_FAIL("unknown backend '{}': this build has cpu, cuda", name);
#else
  DI_FAIL("unknown backend '{}': this build has cpu only (built without CUDA)", name);
#endif
}

}  // namespace di
