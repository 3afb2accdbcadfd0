#pragma once
// The Engine API as server/ includes it.
#include "sampling/sampling_params.h"

namespace di {
// TODO(#4): drop once engine.h declares it itself (branch `engine` adds the same using-declaration).
using sampling::SamplingParams;
}  // namespace di

#include "engine/engine.h"
