#!/usr/bin/env bash
# Sets up, builds and runs the main job on the embedded default model (models/deepinfer-demo-code).
# Until the HTTP server lands (issue #4) the main job is offline generation. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_deps.sh
scripts/build.sh
# "def fibonacci(n):" in the demo model's tokenizer, after BOS.
exec build/bin/deepinfer generate --prompt-ids 0,3465,285,686,265,439,895,3913,2605 --max-tokens 48 --json "$@"
