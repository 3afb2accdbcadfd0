#!/usr/bin/env bash
# Train, export and verify the deepinfer demo model on the GPU machine, in one command:
#     bash scripts/run_demo_training.sh            # full run (~9.5 min wall, fits a 600 s command)
#     SMOKE=1 bash scripts/run_demo_training.sh    # ~1-2 min: same code paths, small slice, short training
# Needs the carried, git-ignored .demo_data/ (scripts/prepare_demo_data.py + make_demo_tokenizer.py).
# Writes into $OUT (at most 8 files): model.tar.partNN (uncompressed tar of deepinfer-demo-code/, split
# in 15 MiB parts), train_log.tsv, run_log.txt, loss.png, verify.json, golden.json.
# Env: TRAIN_SECONDS (default 400), TOTAL_SECONDS (hard wall budget, default 570), SEED (1234).
set -euo pipefail
export PYTHONUNBUFFERED=1
T_START=$(date +%s)
: "${OUT:?set OUT to the output folder}"
SMOKE="${SMOKE:-0}"
SEED="${SEED:-1234}"
TOTAL_SECONDS="${TOTAL_SECONDS:-570}"
# Time reserved after training for the final eval, export, HF verification and packaging.
RESERVE_SECONDS="${RESERVE_SECONDS:-110}"
WORK="$(mktemp -d /tmp/demo_run.XXXXXX)"
MODEL="$WORK/deepinfer-demo-code"
mkdir -p "$OUT"
exec > >(tee "$OUT/run_log.txt") 2>&1

die() { echo "run_demo_training: ERROR: $*" >&2; exit 1; }
[ -f .demo_data/train.jsonl.xz ] || die ".demo_data/train.jsonl.xz missing: carry .demo_data (see docs/demo_model.md)"
[ -f .demo_data/tokenizer/tokenizer.json ] || die ".demo_data/tokenizer missing: carry .demo_data"
python3 -c "import torch, transformers, tokenizers, safetensors, matplotlib; assert torch.cuda.is_available(), 'no CUDA'" \
  || die "python environment lacks torch (CUDA) / transformers / tokenizers / safetensors / matplotlib"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
python3 -c "import torch, transformers, tokenizers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'tokenizers', tokenizers.__version__)"

if [ "$SMOKE" = "1" ]; then
  TRAIN_ARGS=(--train-seconds "${TRAIN_SECONDS:-25}" --max-train-docs 1500 --max-valid-docs 40 --warmup 20
              --measure-steps 10 --eval-windows 16)
  VERIFY_ARGS=(--ppl-windows 16 --mtp-prompts 16 --mtp-gen 32 --sample-tokens 24)
  NAME=deepinfer-demo-code-smoke
else
  TRAIN_ARGS=(--train-seconds "${TRAIN_SECONDS:-400}")
  VERIFY_ARGS=()
  NAME=deepinfer-demo-code
fi
DEADLINE=$((T_START + TOTAL_SECONDS - RESERVE_SECONDS))

echo "== train (seed $SEED, smoke $SMOKE, training must end by $(date -d @$DEADLINE +%T))"
python3 scripts/train_demo_model.py --data-dir .demo_data --out-dir "$MODEL" --log "$OUT/train_log.tsv" \
  --state "$WORK/state" --seed "$SEED" --deadline "$DEADLINE" "${TRAIN_ARGS[@]}"

echo "== verify"
VERIFY_RC=0
python3 scripts/verify_demo_model.py --model-dir "$MODEL" --state "$WORK/state" --train-log "$OUT/train_log.tsv" \
  --data-dir .demo_data --out "$OUT" --model-name "$NAME" "${VERIFY_ARGS[@]}" || VERIFY_RC=$?

echo "== package"
(cd "$MODEL" && sha256sum config.json generation_config.json model.safetensors tokenizer.json tokenizer_config.json > SHA256SUMS)
tar -C "$WORK" -cf "$WORK/model.tar" deepinfer-demo-code
split -b 15M -d -a 2 "$WORK/model.tar" "$OUT/model.tar.part"
NPARTS=$(ls "$OUT"/model.tar.part* | wc -l)
[ "$NPARTS" -le 3 ] || die "model.tar needs $NPARTS parts (> 3): \$OUT would exceed 8 files"
echo "model.tar sha256: $(sha256sum "$WORK/model.tar" | cut -d' ' -f1)  ($(stat -c %s "$WORK/model.tar") bytes, $NPARTS parts)"
ls -la "$OUT"
echo "== done in $(( $(date +%s) - T_START ))s (verify exit status $VERIFY_RC)"
exit "$VERIFY_RC"
