#pragma once
#include <string>

namespace di::cuda {

std::string describe_devices();  // one line per device, or "no CUDA devices"
bool run_probe_kernel();         // launches a trivial sm_90a kernel and checks its result

}  // namespace di::cuda
