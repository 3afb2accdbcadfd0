#include "backend/backend.h"

#include "core/error.h"

namespace di {

#ifdef DI_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend();
std::unique_ptr<Backend> make_cuda_fp32_backend();
#endif

std::unique_ptr<Backend> make_backend(const std::string& name) {
  if (name == "cpu") return make_cpu_backend();
#ifdef DI_HAVE_CUDA
  if (name == "cuda") return make_cuda_backend();
  if (name == "cuda-fp32") return make_cuda_fp32_backend();
  DI_FAIL("unknown backend '{}': this build has cpu, cuda, cuda-fp32", name);
#else
  DI_FAIL("unknown backend '{}': this build has cpu only (built without CUDA)", name);
#endif
}

}  // namespace di
