#!/usr/bin/env bash
# Inference speed on a GPU (docs/design/evaluation.md, "Speed"): `confluence bench predict` on the nycflights13 demo store
# for `small` (the shipped pretrained:small) and `base` (a randomly initialised model of the recipe: the same
# arithmetic as a trained one), at several batch sizes: load, compile, sampling, model and pipeline contexts/s.
#
# Usage, here: `scripts/gpu_wheels.sh` once (wheels the GPU image lacks, into .whl/), then through the device tool:
#   run(command="scripts/gpu_predict.sh", carry=[".whl"], timeout_s=420)
# Each part has its own time limit (store 60 s, small 150 s, base 180 s). Results in $OUT: predict_*.json, summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/gpu_env.sh
source scripts/gpu_env.sh
log() { echo "== $(date -u +%FT%TZ) $*" | tee -a "$OUT/summary.txt"; }
THREADS=${THREADS:-$(( $(nproc) > 3 ? $(nproc) - 2 : 1 ))}
export CONFLUENCE_COMPILE_CACHE=/tmp/gpu_jax_cache
log "machine: $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null); $(nproc) cores"
log "jax: $($PY -c 'import jax; print(jax.__version__, jax.devices())')"
STORE=/tmp/gpu_demo/store
if [ ! -f "$STORE/metadata.json" ]; then
  log "demo store"
  timeout 60 $PY - <<'PYEOF' 2>&1 | tail -2 | tee -a "$OUT/summary.txt"
from confluence.demo import build_nycflights13, demo_metadata_path
from confluence.preprocess.pipeline import preprocess
from confluence.textenc.default import StaticEncoder
preprocess(build_nycflights13("/tmp/gpu_demo/raw"), demo_metadata_path(), "/tmp/gpu_demo/store", encoder=StaticEncoder(),
           progress=False)
print("store built")
PYEOF
fi
log "small (pretrained:small), flights.dep_delay, ${ANCHORS_SMALL:-4000} anchors x 4 draws, $THREADS sampler threads"
timeout -s INT "${T_SMALL:-150}" $CLI bench predict --db "$STORE" --task flights.dep_delay --checkpoint pretrained:small \
  --anchors "${ANCHORS_SMALL:-4000}" --draws 4 --threads "$THREADS" --batch-size 16 --batch-size 128 --batch-size 512 \
  --json "$OUT/predict_small.json" 2>&1 | grep -v Warning | tail -6 | tee -a "$OUT/summary.txt"
log "base (random init), flights.dep_delay, ${ANCHORS_BASE:-1000} anchors x 1 draw, $THREADS sampler threads"
timeout -s INT "${T_BASE:-180}" $CLI bench predict --db "$STORE" --task flights.dep_delay --config base \
  --anchors "${ANCHORS_BASE:-1000}" --draws 1 --threads "$THREADS" --batch-size 32 --batch-size 128 \
  --json "$OUT/predict_base.json" 2>&1 | grep -v Warning | tail -6 | tee -a "$OUT/summary.txt"
log "done"
