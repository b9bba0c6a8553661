#!/usr/bin/env bash
# Fill .whl/ with the pure-Python wheels the offline GPU machine lacks, for .ci/gpu (and
# benchmarks/record_testbed.sh) to install there with --no-deps.
#
#   bash .ci/fetch_wheels.sh [MORE PACKAGES...]
#
# The GPU image (Python 3.12, x86_64 Linux) already has numpy, jinja2, click, rich, packaging,
# pyyaml, tqdm, scipy, torch, cupy and cuda-python, so only these are carried: lark (the spec
# parser), optuna with colorlog (imported by optuna; its SQL storage, sqlalchemy and alembic, is
# not needed: the strategies keep studies in memory) and cmaes (Optuna's CMA-ES). Run it on a
# machine with network access; .whl/ is ignored by git and travels with the working tree. Dask's
# wheels come from .ci/fetch_wheels_dask.sh, which this runs too.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(lark optuna colorlog cmaes "$@")
python3 -m pip download -q --only-binary=:all: --no-deps --implementation cp --python-version 3.12 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d .whl "${packages[@]}"
bash .ci/fetch_wheels_dask.sh >/dev/null  # Dask, for tune --devices / --scheduler
ls -l .whl
du -sh .whl
