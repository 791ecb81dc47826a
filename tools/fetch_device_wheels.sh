#!/bin/sh
# The wheels tools/device_check.py needs on a bare CUDA machine (issue 49): what our package imports beyond the
# machine's own PyTorch, Triton, transformers, pytest and prometheus_client, for its Python (3.12, x86-64).
# Here (with network):   sh tools/fetch_device_wheels.sh            -> .whl/ (git-ignored; about 10 MiB)
# There (no network):    sh tools/fetch_device_wheels.sh --install  -> /tmp/site, then
#                        PYTHONPATH=/tmp/site:. python3 tools/device_check.py
set -e
cd "$(dirname "$0")/.."
WHEELS="llguidance tornado jsonschema jsonschema-specifications referencing rpds-py msgspec pyzmq gguf"
if [ "$1" = "--install" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    exit 0
fi
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> "$(git rev-parse --git-common-dir)/info/exclude"
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl $WHEELS
du -sh .whl
