#!/usr/bin/env bash
# What one device call runs on the lent H200 (docs/benchmarks.md quotes its output). Parts, by argument:
#   alloc            the real-CUDA allocator test (packages/device)
#   tests[=EXPR]     the Megatron GPU tests and the torch backend's offload test (pytest -k EXPR when given)
#   train[=ARGS]     bench/megatron_gpu_train.py (train() megatron vs torch; ARGS comma-separated)
#   mfu=SPEC         bench/megatron_gpu_run.py --mfu SPEC --profile (repeatable; one process per spec;
#                    MFU_TRACE=1 also writes each profiled update's Chrome trace: bench/trace_gaps.py)
#   oldmfu=SPEC      the same from an older commit's tree in .old/ (its own bench and packages), for a
#                    profile of that commit beside HEAD's in one call: bash bench/gpu_old_tree.sh COMMIT
#                    here, then carry [".old"] (needs the wheel folders as mfu does)
#   smoke[=RUNS]     the production path on the tiny presets, text (offload) and VL, 5 steps each: one
#                    SMOKE PASS/FAIL line per run with its per-phase seconds; run it first on a new machine.
#                    RUNS (offload or vl) runs one of them: on a fresh machine the first engine start
#                    compiles for ~2.5 min, so the two may need a call each (600 s a call)
#   prod[=ARGS]      bench/gpu_production_path.py (Megatron actor + vLLM rollout in train(); needs vLLM
#                    (.vx1, .vx2, .whl) and Ray (.rayw) unpacked)
#   real[=ARGS]      bench/gpu_real_shape.py (train() at the 35B's layer shapes vs vLLM's own generate; needs
#                    vLLM and Ray, as prod)
#   sync[=ARGS]      bench/gpu_weight_sync.py (the full-size Qwen3.5-35B-A3B weight sync; needs vLLM)
#   decode[=ARGS]    bench/gpu_rollout_decode.py (the cost model's decode / prefill / CPU-Adam constants; needs vLLM)
#   e.g. bash bench/gpu_session.sh alloc tests train=--steps,50,--split,40 mfu=qwen3moe+gmm,8,32,8,768,2048,16,2048,4
# The folders bench/gpu_prepare.sh builds travel in the calls it prints (each < 64 MiB); this script
# first unpacks those present here into /tmp/site (bench/gpu_unpack.sh: a folder unpacked by an
# earlier call on the same warm machine is skipped). docs/benchmarks.md, "Running on the H200".
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
for d in .vx1 .vx2 .whl .whl2 .whl3 .rayw; do
  [ -d "$d" ] && { bash bench/gpu_unpack.sh "$d" || exit 1; }
done
root=$PWD
export PYTHONPATH=/tmp/site:/tmp/site_fla:$root/packages/launchers/common/src:$root/packages/launchers/qwen35_35b/src:$root/packages/tiny/src:$root/packages/trainer/src:$root/packages/config/src:$root/packages/device/src:$root/packages/ckpt/src:$root/packages/trainer/tests/megatron
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false RAY_DEDUP_LOGS=0 NCCL_NVLS_ENABLE=0
# A fresh machine spends minutes in Triton autotuning and TileLang compiles before step 1 (2026-12-07:
# step 1 at the 35B's shapes did not finish in 580 s). The kernel caches travel: each call packs them into
# $OUT/kernels.tar.xz; copied into .kcache here, the next session's calls carry it (docs/benchmarks.md).
export TRITON_CACHE_AUTOTUNING=1
if [ -f .kcache/kernels.tar.xz ] && [ ! -f "$HOME/.kcache_unpacked" ]; then
  tar -xJf .kcache/kernels.tar.xz -C "$HOME" && touch "$HOME/.kcache_unpacked" && echo "kernel caches unpacked"
fi
pack_kernels() { (cd "$HOME" && ls -d .triton/cache .tilelang/cache 2>/dev/null | xargs -r tar -cJf "$OUT/kernels.tar.xz") || true; }
trap pack_kernels EXIT
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)"
status=0
specs=()
for part in "$@"; do
  case "$part" in
    alloc)
      timeout 90 python3 -m pytest -p no:cacheprovider -q -rs -m gpu packages/device/tests/test_allocator.py 2>&1 \
        | tee "$OUT/allocator.log" || status=1 ;;
    tests|tests=*)
      expr=${part#tests}; expr=${expr#=}
      timeout 420 python3 -m pytest -p no:cacheprovider -q -rs -s ${expr:+-k "$expr"} \
        packages/trainer/tests/megatron/test_megatron_gpu.py packages/trainer/tests/megatron/test_fusions.py tests/test_vl_megatron_gpu.py \
        packages/trainer/tests/runtime/test_torch_backend.py::test_offload_frees_the_device_on_cuda 2>&1 \
        | grep -v -e "Loading weights" -e "Writing model" -e "Warning:" -e "warnings.warn" | tee "$OUT/megatron_gpu_tests.log" | tail -n 30 || status=1 ;;
    train|train=*)
      args=${part#train}; args=${args#=}
      timeout 300 python3 bench/megatron_gpu_train.py --out "$OUT" --hide-from-torch /tmp/site_fla ${args//,/ } 2>&1 \
        | grep -v "Loading weights\|Writing model\|ckpt.component_saved" > "$OUT/train.log" || status=1
      tail -n 3 "$OUT/train.log" ;;
    smoke|smoke=*)
      runs=${part#smoke}; runs=${runs#=}
      [ -f /tmp/site/vllm/__init__.py ] && [ -d /tmp/site/ray ] || { echo "SMOKE FAIL: vLLM or Ray is not in /tmp/site (COLD MACHINE?)"; exit 2; }
      VLLM_USE_FLASHINFER_SAMPLER=0 timeout 560 python3 bench/gpu_production_path.py --out "$OUT/smoke" --steps 5 --runs "${runs:-offload,vl}" --verdict 2>&1 \
        | grep -v "Loading weights\|Writing model" > "$OUT/smoke.log" || status=1
      grep '^SMOKE' "$OUT/smoke.log" || { echo "SMOKE FAIL: no verdict (log tail below)"; tail -n 20 "$OUT/smoke.log"; status=1; }
      n=$(grep -c "CUDA Error" "$OUT/smoke.log"); [ "$n" -eq 0 ] || echo "smoke: $n 'CUDA Error' lines in $OUT/smoke.log: $(grep -m1 "CUDA Error" "$OUT/smoke.log")" ;;
    prod|prod=*)
      args=${part#prod}; args=${args#=}
      [ -f /tmp/site/vllm/__init__.py ] || { echo "COLD MACHINE: vLLM is not in /tmp/site"; exit 2; }
      [ -d /tmp/site/ray ] || { echo "Ray is not in /tmp/site: carry .rayw (bench/gpu_prepare.sh)"; exit 2; }
      VLLM_USE_FLASHINFER_SAMPLER=0 timeout 560 python3 bench/gpu_production_path.py --out "$OUT" ${args//,/ } 2>&1 \
        | grep -v "Loading weights\|Writing model" > "$OUT/production_path.log" || status=1
      grep '^{"run"' "$OUT/production_path.log"; tail -n 5 "$OUT/production_path.log" ;;
    real|real=*)
      args=${part#real}; args=${args#=}
      [ -f /tmp/site/vllm/__init__.py ] && [ -d /tmp/site/ray ] || { echo "COLD MACHINE: vLLM or Ray is not in /tmp/site"; exit 2; }
      VLLM_USE_FLASHINFER_SAMPLER=0 timeout ${REAL_TIMEOUT:-580} python3 bench/gpu_real_shape.py --out "$OUT" ${args//,/ } 2>&1 \
        | grep -v "Loading weights\|Writing model" > "$OUT/real_shape.log" || status=1
      grep '^{"layers"\|^REAL SHAPE' "$OUT/real_shape.log"; tail -n 5 "$OUT/real_shape.log" ;;
    sync|sync=*)
      args=${part#sync}; args=${args#=}
      [ -f /tmp/site/vllm/__init__.py ] || { echo "COLD MACHINE: vLLM is not in /tmp/site"; exit 2; }
      VLLM_USE_FLASHINFER_SAMPLER=0 timeout 560 python3 bench/gpu_weight_sync.py --out "$OUT" ${args//,/ } 2>&1 \
        | grep -v "Loading weights\|Writing model" > "$OUT/weight_sync.log" || status=1
      grep '^RESULT' "$OUT/weight_sync.log"; tail -n 8 "$OUT/weight_sync.log" ;;
    decode|decode=*)
      args=${part#decode}; args=${args#=}
      [ -f /tmp/site/vllm/__init__.py ] || { echo "COLD MACHINE: vLLM is not in /tmp/site"; exit 2; }
      VLLM_USE_FLASHINFER_SAMPLER=0 timeout 540 python3 bench/gpu_rollout_decode.py --out "$OUT" ${args//,/ } 2>&1 \
        | grep -v "Loading weights\|Writing model\|Successfully reset prefix cache" > "$OUT/rollout_decode.log" || status=1
      grep '^RESULT' "$OUT/rollout_decode.log"; grep '^\[' "$OUT/rollout_decode.log" | tail -n 12; tail -n 8 "$OUT/rollout_decode.log" ;;
    mfu=*) specs+=(--mfu "${part#mfu=}") ;;
    oldmfu=*)
      [ -f .old/bench/megatron_gpu_run.py ] || { echo "oldmfu: no .old tree (bash bench/gpu_old_tree.sh COMMIT, carry .old)"; exit 2; }
      old=$root/.old/packages
      n=$(ls -d "$OUT"/oldmfu_* 2>/dev/null | wc -l)
      PYTHONPATH=/tmp/site:/tmp/site_fla:$old/launchers/common/src:$old/tiny/src:$old/trainer/src:$old/config/src:$old/device/src:$old/ckpt/src:$old/trainer/tests/megatron \
        timeout 540 python3 .old/bench/megatron_gpu_run.py --out "$OUT/oldmfu_$n" --phases mfu --profile --mfu "${part#oldmfu=}" 2>&1 \
        | grep -v "Loading weights\|Writing model" >> "$OUT/oldmfu.log" || status=1
      echo "oldmfu ($(cat .old/COMMIT)): $(grep '^{"family"' "$OUT/oldmfu.log" | tail -n 1)" ;;
    *) echo "unknown part: $part"; exit 2 ;;
  esac
done
# One process per spec: a model left allocated by the spec before would count in the next one's
# peak memory (seen: 131.8 GiB instead of 81.7, and an OOM).
for ((i = 0; i < ${#specs[@]}; i += 2)); do
  timeout 540 python3 bench/megatron_gpu_run.py --out "$OUT/mfu_$((i / 2))" --phases mfu --profile ${MFU_TRACE:+--trace} "${specs[i]}" "${specs[i + 1]}" 2>&1 \
    | grep -v "Loading weights\|Writing model" >> "$OUT/mfu.log" || status=1
done
[ ${#specs[@]} -gt 0 ] && grep '^{"family"' "$OUT/mfu.log"
exit $status
