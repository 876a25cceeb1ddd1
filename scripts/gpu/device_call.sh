#!/bin/sh
# One device call on the GPU machine (docs/gpu.md, "Prepared device calls"), from the repository root there:
#   sh scripts/gpu/device_call.sh digits|minilm        carry: build/gpu-device (make gpu-device-prep here)
# Results: $OUT/<part>-{meta,graphs,precision,served}.json and <part>-log.txt.
set -eu
part=${1:?usage: device_call.sh digits|minilm}
out=${OUT:-build/gpu-device-out}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-site build/gpu-device/wheels/*.whl
python3 -c "import tarfile; tarfile.open('build/gpu-device/torchserve.tar.xz').extractall('build/gpu-serving', filter='data')"
export PYTHONPATH="/tmp/gpu-site:$(pwd)" PYTHONUNBUFFERED=1
build/gpu-serving/torchserve/start.sh --exec python3 -m scripts.gpu.device_run --part "$part" --out "$out" 2>&1 | tee "$out/$part-log.txt"
