#!/usr/bin/env bash
# Record the test bed's missing exhaustive searches on a bare GPU machine (as .ci/gpu sets it up:
# the wheels carried in .whl/ into /tmp/site, then gemmgen from this tree). The new databases go
# to $OUT (default ./out): copy them into benchmarks/tuning/ and commit them.
#
#   bash benchmarks/record_testbed.sh [--all | --dry-run]
set -euo pipefail

OUT="${OUT:-./out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
cd "$(dirname "${BASH_SOURCE[0]}")/.."

shopt -s nullglob
wheels=(.whl/*.whl)
shopt -u nullglob
if ((${#wheels[@]})); then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "${wheels[@]}"
fi
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export GEMMGEN_CACHE=/tmp/gemmgen-cache
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader || true
python3 benchmarks/record_testbed.py --out "$OUT" "$@" 2>&1 | tee "$OUT/record_testbed.log"
