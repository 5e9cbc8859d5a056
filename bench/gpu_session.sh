#!/usr/bin/env bash
# What one device call runs on the lent H200 (docs/benchmarks.md quotes its output).
#   bash bench/gpu_session.sh check     # allocator test, Megatron GPU tests, train() megatron vs torch
#   bash bench/gpu_session.sh mfu SPEC... # actor-update MFU runs (bench/megatron_gpu_run.py --mfu SPEC)
# Wheels the machine lacks travel in .whl/ (megatron-core, megatron-bridge, ray, ...: see the docs).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# FLA in a folder of its own: the torch backend's workers run without it (see megatron_gpu_train.py).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  $(ls .whl/*.whl | grep -v -e fla_core -e flash_linear) || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site_fla \
  .whl/fla_core-*.whl .whl/flash_linear_attention-*.whl || exit 1
root=$PWD
export PYTHONPATH=/tmp/site:/tmp/site_fla:$root/packages/trainer/src:$root/packages/config/src:$root/packages/device/src:$root/packages/ckpt/src:$root/packages/trainer/tests/megatron
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false RAY_DEDUP_LOGS=0 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)"
mode=${1:-check}
shift || true
status=0
if [ "$mode" = check ]; then
  timeout 90 python3 -m pytest -p no:cacheprovider -q -rs -m gpu packages/device/tests/test_allocator.py 2>&1 \
    | tee "$OUT/allocator.log" || status=1
  timeout 240 python3 -m pytest -p no:cacheprovider -q -rs -s packages/trainer/tests/megatron/test_megatron_gpu.py 2>&1 \
    | grep -v "Loading weights\|Writing model" | tee "$OUT/megatron_gpu_tests.log" || status=1
  timeout 270 python3 bench/megatron_gpu_train.py --out "$OUT" --hide-from-torch /tmp/site_fla "$@" 2>&1 \
    | grep -v "Loading weights\|Writing model\|ckpt.component_saved" > "$OUT/train.log" || status=1
  tail -n 4 "$OUT/train.log"
elif [ "$mode" = mfu ]; then
  args=()
  for spec in "$@"; do args+=(--mfu "$spec"); done
  timeout 540 python3 bench/megatron_gpu_run.py --out "$OUT" --phases mfu --profile "${args[@]}" 2>&1 \
    | grep -v "Loading weights\|Writing model" | tee "$OUT/mfu.log" | grep -v "^\[" | tail -n 40 || status=1
fi
exit $status
