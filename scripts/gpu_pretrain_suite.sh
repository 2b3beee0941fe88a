#!/usr/bin/env bash
# Pretraining on a corpus that holds the development suite's tune databases beside the random ones, and the
# pretrained `base` measured zero-shot on the suite's check databases, in one device call (issue 51, point 5):
#
#   1. the check databases' stores, preprocessed from their raw Parquet (in the background);
#   2. the corpus: DBS random databases (seed 1000) + TPC-H 0.01 + the tune databases given in .gpu_data/ (never a
#      check database: `corpus build --database` refuses them);
#   3. `pretrain-base` and `pretrain-small` side by side on the one GPU (the small model's step is bound by launch
#      overhead, so the two share the chip cheaply; each gets half the sampler threads), each with a fixed length
#      (STEPS_BASE, STEPS_SMALL) so its schedule finishes, and a time limit that stops it with a checkpoint;
#   4. the `small` model exported into $OUT/small.tar (1.2 MiB: it is measured zero-shot and fine-tuned on the CPU
#      afterwards); the `base` model (74 MiB) cannot come back, so it is measured here: `evaluate --gbdt` on each
#      check database's test split (MAX_SEEDS rows a task), JSON into $OUT.
#
# Usage, here: `scripts/gpu_wheels.sh` once, `scripts/gpu_suite_data.sh` (the raw Parquet of the suite members into
# .gpu_data/), `scripts/gpu_stamp.sh`, then through the device tool:
#   run(command="scripts/gpu_pretrain_suite.sh", carry=[".whl", ".gpu_data"], timeout_s=600)
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/gpu_env.sh
source scripts/gpu_env.sh
T0=$(date +%s)
DBS=${DBS:-400}
BUDGET=${BUDGET:-570}         # seconds the whole script may take (the call's 600 less the transfers)
STEPS_BASE=${STEPS_BASE:-2500}
STEPS_SMALL=${STEPS_SMALL:-10000}  # 2026-11-30 on an H200 beside base: 39.6 steps/s
MAX_SEEDS=${MAX_SEEDS:-1000}
EVAL_S=${EVAL_S:-150}         # seconds kept for the zero-shot evaluations at the end
TUNE=${TUNE:-f1db sakila}
CHECK=${CHECK:-euip intl_football unvotes}
SETS_BASE=${SETS_BASE:-}      # extra `--set K=V` words for the base run (a CPU dry run: --set sampler.batch_size=2)
CORES=$(nproc)
HALF=$(( CORES > 5 ? (CORES - 2) / 2 : 1 ))
LOG="$OUT/log.txt"
log() { echo "== $(date -u +%FT%TZ) +$(( $(date +%s) - T0 ))s $*" | tee -a "$LOG"; }
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # two training processes share the GPU

log "machine: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null); $CORES cores"
log "jax: $($PY -c 'import jax; print(jax.__version__, jax.devices())')"
meta() { echo "confluence/devsuite/$1.metadata.json"; }

log "1. check databases' stores ($CHECK), in the background"
for name in $CHECK; do
  $CLI preprocess ".gpu_data/$name" --metadata "$(meta "$name")" --out "/tmp/check/$name" --threads 2 --quiet \
    > "/tmp/check_$name.log" 2>&1 &
done

log "2. corpus: $DBS random databases + TPC-H 0.01 + $TUNE"
EXTRA=()
for name in $TUNE; do EXTRA+=(--database "$(meta "$name")=.gpu_data/$name"); done
$CLI corpus build --out /tmp/suite_corpus --databases "$DBS" --seed 1000 --heldout 0.02 --tpch 0.01 "${EXTRA[@]}" \
  --workers "$CORES" --no-progress 2>&1 | tail -5 | tee -a "$LOG"

LIMIT=$(( $(left) - EVAL_S - 30 ))
log "3. pretrain-base ($STEPS_BASE steps) and pretrain-small ($STEPS_SMALL steps) side by side, at most $LIMIT s each"
for recipe in base small; do
  steps=$([ $recipe = base ] && echo "$STEPS_BASE" || echo "$STEPS_SMALL")
  sets=$([ $recipe = base ] && echo "$SETS_BASE")
  # shellcheck disable=SC2086
  timeout -s INT "$LIMIT" $CLI pretrain --corpus /tmp/suite_corpus --out "/tmp/pt_$recipe" --config "pretrain-$recipe" \
    --max-steps "$steps" --set loop.ckpt_every=500 --set sampler.threads=$HALF $sets --no-progress \
    > "/tmp/pt_$recipe.log" 2>&1 &
  eval "pid_$recipe=$!"
done
# shellcheck disable=SC2154
wait "$pid_base"; st_base=$?
# shellcheck disable=SC2154
wait "$pid_small"; st_small=$?
for recipe in base small; do
  tail -4 "/tmp/pt_$recipe.log" | tee -a "$LOG"
  $PY - "$recipe" <<'EOF' 2>&1 | tee -a "$LOG"
import csv, sys
r = sys.argv[1]
rows = list(csv.DictReader(open(f"/tmp/pt_{r}/scalars.csv")))
train = [(int(x["step"]), float(x["wall_time"])) for x in rows if x["tag"] == "train/loss"]
held = [(int(x["step"]), float(x["value"])) for x in rows if x["tag"] == "heldout/loss"]
if train:
    print(f"{r}: last step {train[-1][0]}, {train[-1][0] / max(train[-1][1] - train[0][1], 1e-3):.1f} steps/s after the first")
print(f"{r}: heldout/loss by step:", ", ".join(f"{s}: {v:.4f}" for s, v in held))
EOF
done
log "pretrain exits: base $st_base, small $st_small (124: stopped by the time limit, schedule unfinished)"
cp /tmp/pt_base/scalars.csv "$OUT/scalars_base.csv" 2>/dev/null

log "4a. export small"
cat > /tmp/card.json <<EOF
{"corpus": "$DBS random databases (seed 1000, heldout 0.02) + TPC-H 0.01 + the development suite's tune databases $TUNE (confluence corpus build --database)",
 "hardware": "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)",
 "command": "scripts/gpu_pretrain_suite.sh (pretrain-small, $STEPS_SMALL steps, beside pretrain-base; exit $st_small)"}
EOF
$CLI pretrained export /tmp/pt_small --name suite --info /tmp/card.json --to /tmp/ship 2>&1 | tail -2 | tee -a "$LOG"
cp /tmp/pt_small/scalars.csv /tmp/pt_small/config.json /tmp/ship/suite/ 2>/dev/null
tar -C /tmp/ship -cf "$OUT/small.tar" suite 2>&1 | tee -a "$LOG"

wait  # the check stores
for name in $CHECK; do tail -2 "/tmp/check_$name.log" | tee -a "$LOG"; done
log "4b. base zero-shot on the check databases' test split ($MAX_SEEDS rows a task, LightGBM beside), at most $(( $(left) - 5 )) s"
# one at a time (2026-11-30: three side by side, each LightGBM on every core, finished one of three in 168 s; one
# at a time took about 30 s each)
for name in $CHECK; do
  timeout -s INT "$(( $(left) - 5 ))" $CLI evaluate --checkpoint /tmp/pt_base --db "/tmp/check/$name" --split test \
    --max-seeds "$MAX_SEEDS" --gbdt --json "$OUT/zeroshot_base_$name.json" --no-progress > "/tmp/eval_$name.log" 2>&1
  tail -14 "/tmp/eval_$name.log" | tee -a "$LOG"
done
log "done"
