#!/usr/bin/env bash
# Put the raw Parquet of development-suite members into .gpu_data/<name>/ (git-ignored) for a device call
# (scripts/gpu_pretrain_suite.sh carries it: the GPU machine reaches no repository). SUITE is the folder of built
# members (<name>/raw, as `confluence bench quality --suite` reads; a member missing there is an error naming the
# command that builds it). Usage: SUITE=/tmp/suite scripts/gpu_suite_data.sh [NAME ...]
set -euo pipefail
cd "$(dirname "$0")/.."
SUITE=${SUITE:-/tmp/suite}
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(f1db sakila euip intl_football unvotes)
rm -rf .gpu_data && mkdir -p .gpu_data
for name in "${names[@]}"; do
  if [ ! -d "$SUITE/$name/raw" ]; then
    echo "$SUITE/$name/raw is missing: build it with confluence devsuite build $name --out $SUITE/$name/raw" >&2
    exit 1
  fi
  cp -r "$SUITE/$name/raw" ".gpu_data/$name"
done
du -sh .gpu_data
