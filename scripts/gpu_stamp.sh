#!/usr/bin/env bash
# Stamp, here, the code a GPU run will be: this checkout's commit, whether the package differs from it and a digest
# of the difference, into .whl/code_stamp.json (carried with the wheels). The device tool copies the working tree
# without .git, so a run there records its commit from this stamp (CONFLUENCE_CODE_STAMP, set by gpu_env.sh; the
# checkpoint's `code` then carries `stamped_at`). Run it right before each `run(...)` whose checkpoints matter:
# an edit after the stamp is not in it. scripts/gpu_wheels.sh runs it once at its end.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
mkdir -p .whl
"$PY" -c "from confluence.toolkit.provenance import write_stamp; print(write_stamp('.whl/code_stamp.json'))"
