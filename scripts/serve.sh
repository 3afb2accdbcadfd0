#!/usr/bin/env bash
# Sets up, builds and runs the main job. Until the HTTP server lands (issue #4) the main job makes
# the tiny DeepSeek-V3-architecture model and generates from it. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_deps.sh
scripts/build.sh
MODEL_DIR=${MODEL_DIR:-build/models/tiny-deepseek-v3}
if [[ ! -f $MODEL_DIR/config.json ]]; then
  build/bin/deepinfer make-model --arch deepseek_v3 --preset tiny --out "$MODEL_DIR" --seed 0
fi
exec build/bin/deepinfer generate --model "$MODEL_DIR" --prompt-ids 1,2,3,4,5 --max-tokens 32 --json "$@"
