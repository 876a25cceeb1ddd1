#!/bin/sh
# One device call on the GPU machine (docs/gpu.md, "Prepared device calls"), from the repository root there:
#   sh scripts/gpu/device_call.sh <model>      carry: build/gpu-device/common and build/gpu-device/<model>
#                                              (make gpu-device-prep here)
# Results: $OUT/<model>-{meta,graphs,precision,served}.json and <model>-log.txt.
set -eu
model=${1:?usage: device_call.sh <model> (a folder of models/)}
out=${OUT:-build/gpu-device-out}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/gpu-site build/gpu-device/common/wheels/*.whl
python3 -c "import tarfile; tarfile.open('build/gpu-device/common/torchserve.tar.xz').extractall('build/gpu-serving', filter='data')"
export PYTHONPATH="/tmp/gpu-site:$(pwd)/build/gpu-device/common/site:$(pwd)" PYTHONUNBUFFERED=1
build/gpu-serving/torchserve/start.sh --exec python3 -m scripts.gpu.device_run --part "$model" --out "$out" 2>&1 | tee "$out/$model-log.txt"
