#!/usr/bin/env bash
# Wheels of Dask distributed for the offline GPU machines (Python 3.12, manylinux x86_64), into
# .whl/ (git-ignored), where .ci/gpu installs every wheel it finds before the GPU tests run.
#
#   bash .ci/fetch_wheels_dask.sh        # here, where PyPI is reachable; then carry .whl
#
# Only what the GPU image lacks: dask and distributed and the pure-Python pieces they need beyond
# the image (tornado, tblib, zict, partd, locket). The image already has numpy, jinja2, click,
# pyyaml, psutil, msgpack, toolz, fsspec, sortedcontainers, packaging and urllib3; cloudpickle is
# carried too, since distributed needs 3.0 or newer and the image's version is not recorded.
# About 3 MiB in all. Pinned, so that one version of each lands in .whl/.
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=(
    dask==2026.8.0
    distributed==2026.8.0
    tornado==6.6.1
    tblib==3.2.2
    zict==3.0.0
    partd==1.4.2
    locket==1.0.0
    cloudpickle==3.1.2
)
mkdir -p .whl
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"
du -ch .whl/dask-* .whl/distributed-* .whl/tornado-* .whl/tblib-* .whl/zict-* .whl/partd-* \
    .whl/locket-* .whl/cloudpickle-* | tail -1
