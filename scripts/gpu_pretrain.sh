#!/usr/bin/env bash
# The longest pretraining run one device call can hold (issue 18), on one GPU machine: a corpus of many random
# databases (+ TPC-H) built on its 16 cores, `confluence pretrain` with a recipe for STEPS steps inside a time
# limit, and the result exported as a shippable model (the files `pretrained:NAME` needs, <= 25 MiB for `small`).
#
# Usage, here: `scripts/gpu_wheels.sh` once (wheels the GPU image lacks, into .whl/), then through the device tool:
#   run(command="DBS=400 STEPS=40000 scripts/gpu_pretrain.sh", carry=[".whl"], timeout_s=600)
# Settings (environment): DBS random databases (default 400; seed 1000 on, as docs/pretrained.md's corpus),
# STEPS (default 40000), RECIPE (default pretrain-small: the shipped model's size), MINUTES the training's own
# limit (default 7.5: the call's 10 minutes less corpus, compile and export), SETS extra `--set K=V` words.
# Results land in $OUT (or ./gpu_out when OUT is unset): the exported model (state.eqx, meta.json, card.json),
# scalars.csv, the run's config.json and log.txt. The returned folder is a checkpoint (`confluence evaluate
# --checkpoint DIR`, `train --init-from DIR`): check it here, on validation only, against the shipped model
# (docs/pretrained.md, "selection") before shipping it into the package (`confluence pretrained export`).
# If the time limit stops training first, the run's last checkpoint is exported (every 1,000 steps) and log.txt
# says so: its cosine schedule did not finish, so prefer a STEPS that ends inside MINUTES.
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/gpu_env.sh
source scripts/gpu_env.sh
DBS=${DBS:-400}
STEPS=${STEPS:-40000}
RECIPE=${RECIPE:-pretrain-small}
MINUTES=${MINUTES:-7.5}
LOG="$OUT/log.txt"
log() { echo "== $(date -u +%FT%TZ) $*" | tee -a "$LOG"; }

log "machine: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null); $(nproc) cores"
log "jax: $($PY -c 'import jax; print(jax.__version__, jax.devices())')"
TPCH=()
command -v tpchgen-cli >/dev/null && TPCH=(--tpch 0.01) || log "tpchgen-cli missing: no TPC-H member"
log "corpus: $DBS random databases (seed 1000) ${TPCH[*]}"
$CLI corpus build --out /tmp/gpu_corpus --databases "$DBS" --seed 1000 --heldout 0.02 "${TPCH[@]}" \
  --workers "$(nproc)" --no-progress 2>&1 | tail -4 | tee -a "$LOG"

log "pretrain: $RECIPE, $STEPS steps, at most $MINUTES minutes"
start=$(date +%s)
# SIGINT on the time limit: the run writes a checkpoint before it exits (docs/model_and_training.md)
# shellcheck disable=SC2086
timeout -s INT "${MINUTES}m" $CLI pretrain --corpus /tmp/gpu_corpus --out /tmp/gpu_pt --config "$RECIPE" \
  --max-steps "$STEPS" --set loop.val_every=2000 --set loop.ckpt_every=1000 ${SETS:-} --no-progress 2>&1 \
  | tail -25 | tee -a "$LOG"
status=${PIPESTATUS[0]}
log "pretrain exit $status after $(( $(date +%s) - start )) s$([ "$status" = 124 ] && echo ': stopped by the time limit, schedule unfinished')"

log "export"
cat > /tmp/gpu_card.json <<EOF
{"corpus": "$DBS random databases (confluence corpus build --databases $DBS --seed 1000 --heldout 0.02 ${TPCH[*]})",
 "hardware": "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)",
 "wall_time_s": $(( $(date +%s) - start )),
 "command": "DBS=$DBS STEPS=$STEPS RECIPE=$RECIPE scripts/gpu_pretrain.sh (exit $status)"}
EOF
$CLI pretrained export /tmp/gpu_pt --name gpu --info /tmp/gpu_card.json --to /tmp/gpu_ship 2>&1 | tail -3 | tee -a "$LOG"
cp /tmp/gpu_ship/gpu/* "$OUT"/ 2>/dev/null || log "export failed: no model"
cp /tmp/gpu_pt/scalars.csv /tmp/gpu_pt/config.json "$OUT"/ 2>/dev/null
[ -f /tmp/gpu_pt/scalars.csv ] && $PY - <<'EOF' 2>&1 | tee -a "$LOG"
import csv
rows = [r for r in csv.DictReader(open("/tmp/gpu_pt/scalars.csv"))]
held = [(int(r["step"]), float(r["value"])) for r in rows if r["tag"] == "heldout/loss"]
print("heldout/loss by step:", ", ".join(f"{s}: {v:.4f}" for s, v in held))
EOF
log "done"
