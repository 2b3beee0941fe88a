#!/usr/bin/env bash
# The longest pretraining run one device call can hold (issue 18), on one GPU machine: a corpus of many random
# databases (+ TPC-H) built on its 16 cores, `confluence pretrain` with a recipe for STEPS steps inside a time
# limit, and the result exported as a shippable model (the files `pretrained:NAME` needs, <= 25 MiB for `small`).
#
# Usage, here: `scripts/gpu_wheels.sh` once (wheels the GPU image lacks, into .whl/), then through the device tool:
#   run(command="DBS=400 scripts/gpu_pretrain.sh", carry=[".whl"], timeout_s=600)
# Settings (environment): DBS random databases (default 400; seed 1000 on, as docs/guide/pretrained.md's corpus);
# STEPS (default `auto`: a probe run measures steps/s on this machine over 15 s of steps, and STEPS is what fits
# the time left, so the cosine schedule finishes; FALLBACK_STEPS, default 20000, when the probe could not measure);
# RECIPE (default pretrain-small: the shipped model's size); BUDGET the seconds the whole script may take (default
# 560: the call's 600 less the transfers); THREADS sampler threads (default: the machine's cores less 2; the
# batches do not depend on it); SETS extra `--set K=V` words (e.g. SETS="--set model.n_layers=4").
# Results land in $OUT (or ./gpu_out when OUT is unset): the exported model (state.eqx, meta.json, card.json),
# scalars.csv, the run's config.json and log.txt. The returned folder is a checkpoint (`confluence evaluate
# --checkpoint DIR`, `train --init-from DIR`): check it here, on validation only, against the shipped model
# (docs/guide/pretrained.md, "selection") before shipping it into the package (`confluence pretrained export`).
# If the time limit stops training first, the run's last checkpoint is exported (every 1,000 steps) and log.txt
# says so: its cosine schedule did not finish, so prefer a STEPS that ends inside MINUTES.
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/gpu_env.sh
source scripts/gpu_env.sh
T0=$(date +%s)
DBS=${DBS:-400}
STEPS=${STEPS:-auto}
RECIPE=${RECIPE:-pretrain-small}
BUDGET=${BUDGET:-560}
THREADS=${THREADS:-$(( $(nproc) > 3 ? $(nproc) - 2 : 1 ))}
SETS="--set sampler.threads=$THREADS ${SETS:-}"
LOG="$OUT/log.txt"
log() { echo "== $(date -u +%FT%TZ) $*" | tee -a "$LOG"; }

log "machine: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null); $(nproc) cores"
log "jax: $($PY -c 'import jax; print(jax.__version__, jax.devices())')"
TPCH=()
command -v tpchgen-cli >/dev/null && TPCH=(--tpch 0.01) || log "tpchgen-cli missing: no TPC-H member"
log "corpus: $DBS random databases (seed 1000) ${TPCH[*]}"
$CLI corpus build --out /tmp/gpu_corpus --databases "$DBS" --seed 1000 --heldout 0.02 "${TPCH[@]}" \
  --workers "$(nproc)" --no-progress 2>&1 | tail -4 | tee -a "$LOG"

if [ "$STEPS" = auto ]; then
  log "probe: $RECIPE until 15 s of steps are logged (at most 100 s) to measure steps/s"
  probe0=$(date +%s)
  rm -rf /tmp/gpu_probe  # this script's scratch run
  # shellcheck disable=SC2086
  $CLI pretrain --corpus /tmp/gpu_corpus --out /tmp/gpu_probe --config "$RECIPE" --max-steps 1000000 \
    --set loop.val_every=1000000 --set loop.ckpt_every=1000000 $SETS --no-progress >/tmp/gpu_probe.log 2>&1 &
  probe=$!
  # the span of logged training steps so far (0 until two are logged)
  span() { awk -F, '$3 == "train/loss" { if (!t0) t0 = $2; t = $2 } END { print int(t - t0) }' /tmp/gpu_probe/scalars.csv 2>/dev/null || echo 0; }
  while kill -0 $probe 2>/dev/null && [ "$(span)" -lt 15 ] && [ $(( $(date +%s) - probe0 )) -lt 100 ]; do sleep 2; done
  kill -TERM $probe 2>/dev/null; wait $probe  # (a background job ignores SIGINT; the probe needs no checkpoint)
  # steps/s from the training rows after the first 10 s of steps (compile excluded); the time before the first step
  # (startup + compile) is paid again by the real run
  read -r RATE FIRST < <($PY - "$probe0" <<'EOF'
import csv, sys
rows = [(int(r["step"]), float(r["wall_time"])) for r in csv.DictReader(open("/tmp/gpu_probe/scalars.csv"))
        if r["tag"] == "train/loss"]
if len(rows) >= 3:  # else no figures: the fallback below
    t_first = rows[0][1]
    late = [r for r in rows if r[1] >= t_first + min(10.0, (rows[-1][1] - t_first) / 2)]
    rate = (late[-1][0] - late[0][0]) / max(late[-1][1] - late[0][1], 1e-3)
    print(f"{rate:.2f} {t_first - float(sys.argv[1]):.0f}")
EOF
)
  LEFT=$(( BUDGET - ($(date +%s) - T0) - 40 ))  # 40 s for the export and the files
  if [ -n "${RATE:-}" ] && [ "$RATE" != 0.00 ]; then
    STEPS=$($PY -c "print(max(100, int($RATE * ($LEFT - $FIRST - 15) * 0.92) // 100 * 100))")
    log "probe: $RATE steps/s, ${FIRST} s to the first step; $LEFT s left -> STEPS=$STEPS"
  else
    STEPS=${FALLBACK_STEPS:-20000}
    tail -5 /tmp/gpu_probe.log | tee -a "$LOG"
    log "probe: too few steps to measure a rate; STEPS=$STEPS (FALLBACK_STEPS), the time limit may stop it first"
  fi
fi
MINUTES=$($PY -c "print(max(1.0, round(($BUDGET - ($(date +%s) - $T0) - 40) / 60, 2)))")
log "pretrain: $RECIPE, $STEPS steps, at most $MINUTES minutes ($SETS)"
start=$(date +%s)
# SIGINT on the time limit: the run writes a checkpoint before it exits (docs/design/model_and_training.md)
# shellcheck disable=SC2086
timeout -s INT "${MINUTES}m" $CLI pretrain --corpus /tmp/gpu_corpus --out /tmp/gpu_pt --config "$RECIPE" \
  --max-steps "$STEPS" --set loop.val_every=2000 --set loop.ckpt_every=1000 $SETS --no-progress 2>&1 \
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
