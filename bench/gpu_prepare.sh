#!/usr/bin/env bash
# Builds, from scratch, every folder a GPU session carries to the lent H200 (no registry there), and
# prints the device calls that carry them (each call's working tree + carried folders < 64 MiB).
# usage: bash bench/gpu_prepare.sh [ROOT]     (ROOT: the checkout the device calls send, default this one;
#                                             ~5 min; needs pip, unzip, xz, PyPI)
# Makes in the repository root, git-ignored through .git/info/exclude:
#   .vx1   vLLM 0.26.0's core library, xz          .vx2  the rest of vLLM 0.26.0, xz
#   .vx3   the Python packages vLLM needs that the machine lacks (wheels; xgrammar 0.2.7: 0.2.9
#          breaks with apache-tvm-ffi 0.1.10)
#   .whl   megatron-core, Megatron-Bridge, modelopt, FLA, hydra/omegaconf (antlr4 built here from its
#          sdist), pulp, pydantic, structlog, blake3: versions from requirements/gpu.lock
#   .rayw  Ray (gpu.lock's version) without its Java jars, dashboard build and rllib/data/serve/tune/
#          train/llm, xz; jsonschema and its three dependencies (wheels)
# vLLM 0.26.0 pins torch 2.11.0 / CUDA 13 = the machine's own torch, so no torch travels. Unpack there
# with bench/gpu_unpack.sh; run with bench/gpu_session.sh (docs/benchmarks.md, "Running on the H200").
set -euo pipefail
ROOT=$(cd "${1:-$(dirname "$0")/..}" && pwd)
WORK=${WORK:-/tmp/grpo_gpu_prepare}
LOCK=$(cd "$(dirname "$0")/.." && pwd)/requirements/gpu.lock
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64)
PIPDL=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}")
pin() { local v; v=$(grep -i "^$1==" "$LOCK" | head -1); [ -n "$v" ] || { echo "$1 is not in $LOCK" >&2; exit 2; }; echo "$v"; }
VLLM_DEPS=(llguidance==1.7.6 openai-harmony==0.0.8 apache-tvm-ffi==0.1.10
      cachetools==8.0.2 cbor2==6.3.0 compressed-tensors==0.17.0 fastapi==0.136.3 httpx2==2.16.2
      loguru==0.7.3 msgspec==0.23.0 openai==3.60.0 opentelemetry-api==1.45.2
      partial-json-parser==0.2.1.1.post7 pybase64==1.5.1 pyzmq==27.3.0 sniffio==1.3.1
      starlette==1.10.0 xgrammar==0.2.7 depyf==0.20.0 astor==0.8.1 dill==0.4.1 setproctitle==1.3.8
      pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5)
TRAIN=(megatron-core megatron-bridge nvidia-modelopt fla-core flash-linear-attention omegaconf hydra-core
       pulp pydantic pydantic-core annotated-types typing-inspection structlog blake3)
RAY_DEPS=(jsonschema jsonschema-specifications referencing rpds-py)

EXC=$(git -C "$ROOT" rev-parse --git-path info/exclude)
case "$EXC" in /*) ;; *) EXC=$ROOT/$EXC ;; esac
mkdir -p "$(dirname "$EXC")" "$WORK/whl"
for d in .vx1 .vx2 .vx3 .whl .rayw; do
  grep -qxF "/$d/" "$EXC" 2>/dev/null || echo "/$d/" >> "$EXC"
  rm -rf "${ROOT:?}/$d" && mkdir -p "$ROOT/$d"
done

# vLLM, stripped of what an H200 running offline vllm.LLM does not load.
V=$(pin vllm); W=$WORK/whl/vllm-${V#*==}-cp38-abi3-manylinux_2_28_x86_64.whl
[ -f "$W" ] || "${PIPDL[@]}" -d "$WORK/whl" "$V"
rm -rf "$WORK/tree" && mkdir -p "$WORK/tree" && unzip -q "$W" -d "$WORK/tree"
( cd "$WORK/tree"
  rm -f vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so     # FA2: on SM90 vLLM uses FA3
  rm -f vllm/vllm-rs                                  # Rust serve frontend only
  rm -f vllm/third_party/deep_gemm/_C.cpython-31[0134]-x86_64-linux-gnu.so   # other Pythons
  rm -rf vllm/third_party/fmha_sm100                  # SM100 only
  tar -cf - vllm/_C_stable_libtorch.abi3.so | xz -9e -T2 > "$ROOT/.vx1/vllm_a.tar.xz"
  tar --exclude=vllm/_C_stable_libtorch.abi3.so -cf - vllm vllm-*.dist-info | xz -9e -T2 > "$ROOT/.vx2/vllm_b.tar.xz" )
"${PIPDL[@]}" -d "$ROOT/.vx3" "${VLLM_DEPS[@]}"

# Training side, at the lock's versions; antlr4-python3-runtime is an sdist only: built into a wheel here.
for p in "${TRAIN[@]}"; do "${PIPDL[@]}" -d "$ROOT/.whl" "$(pin "$p")"; done
python3 -m pip wheel -q --no-deps --no-binary :all: -w "$ROOT/.whl" "$(pin antlr4-python3-runtime)"

# Ray, stripped.
R=$(pin ray); rm -rf "$WORK/ray" && mkdir -p "$WORK/ray"
"${PIPDL[@]}" -d "$WORK/ray" "$R"
( cd "$WORK/ray" && unzip -q ray-*.whl && rm -f ray-*.whl
  rm -rf ray/jars ray/dashboard/client/build ray/rllib ray/data ray/serve ray/tune ray/train ray/llm
  tar -cf - ray ray-*.dist-info | xz -9 -T2 > "$ROOT/.rayw/ray.tar.xz" )
for p in "${RAY_DEPS[@]}"; do "${PIPDL[@]}" -d "$ROOT/.rayw" "$(pin "$p")"; done

# The calls: folders in this order, packed greedily under 64 MiB less the working tree that travels
# with every call (tracked and untracked-not-ignored files) and 4 MiB to spare.
tree=$(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | xargs -0 cat 2>/dev/null | wc -c)
budget=$(( 64 * 1048576 - tree - 4 * 1048576 ))
echo "working tree $(( tree / 1048576 )) MiB; per call up to $(( budget / 1048576 )) MiB of carried folders"
call=() used=0 n=0
flush() { [ ${#call[@]} -eq 0 ] && return; n=$((n + 1)); echo "call $n: carry [${call[*]}]  ($(( used / 1048576 )) MiB): bash bench/gpu_unpack.sh ${call[*]}"; call=(); used=0; }
for d in .vx1 .vx2 .vx3 .whl .rayw; do
  s=$(du -sb "$ROOT/$d" | cut -f1)
  [ "$s" -le "$budget" ] || { echo "$d is $(( s / 1048576 )) MiB: over one call's budget" >&2; exit 2; }
  [ $((used + s)) -le "$budget" ] || flush
  call+=("$d"); used=$((used + s))
done
flush
echo "(the last call's command goes on after its unpack: ... && bash bench/gpu_session.sh PARTS)"
