#!/usr/bin/env bash
# Sets up, builds and runs the main job: the OpenAI/Anthropic-compatible server on the embedded
# default model (models/deepinfer-demo-code), at http://127.0.0.1:8000. Idempotent.
# Extra arguments go to `deepinfer serve` (see `build/bin/deepinfer serve --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_deps.sh
scripts/build.sh
exec build/bin/deepinfer serve "$@"
