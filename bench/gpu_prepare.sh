#!/usr/bin/env bash
# Builds, from scratch, every folder a GPU session carries to the lent GPU machine (no registry there),
# and prints the device calls that carry them (each call's working tree + carried folders < 64 MiB).
# usage: bash bench/gpu_prepare.sh [ROOT]     (ROOT: the checkout the device calls send, default this one;
#                                             ~4 min; needs pip, unzip, xz, PyPI)
#        DRY_RUN=1 bash bench/gpu_prepare.sh  (prints what it would fetch, `fetch KIND NAME==VERSION`)
# What travels is derived from requirements/gpu.lock by bench/gpu_carry.py: every package the lock's
# roots need that the machine's image (bench/gpu_machine.txt) lacks, at the lock's version, less the
# subtrees it names as not carried, with their reasons (`python3 bench/gpu_carry.py --explain`).
# Makes in the repository root, git-ignored through .git/info/exclude:
#   .vx1   vLLM's core library, xz          .vx2  the rest of vLLM, xz
#   .rayw  Ray without its Java jars, dashboard build and rllib/data/serve/tune/train/llm, xz
#   .whl   every other carried package as a wheel (sdist-only ones built here); .whl2, .whl3 what does
#          not fit one call's budget beside the working tree (first fit, largest wheel first)
# vLLM pins torch 2.11.0 / CUDA 13 = the machine's own torch, so no torch travels. Unpack there
# with bench/gpu_unpack.sh; run with bench/gpu_session.sh (docs/benchmarks.md, "Running on the GPU").
set -euo pipefail
ROOT=$(cd "${1:-$(dirname "$0")/..}" && pwd)
HERE=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-/tmp/grpo_gpu_prepare}
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64)
PIPDL=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}")
PLAN=$(python3 "$HERE/bench/gpu_carry.py")
if [ -n "${DRY_RUN:-}" ]; then echo "$PLAN" | sed 's/^/fetch /'; exit 0; fi
# the call budget: 64 MiB less the working tree every call sends (tracked and untracked-not-ignored
# files) and 4 MiB to spare
tree=$(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | xargs -0 cat 2>/dev/null | wc -c)
budget=$(( 64 * 1048576 - tree - 4 * 1048576 ))

EXC=$(git -C "$ROOT" rev-parse --git-path info/exclude)
case "$EXC" in /*) ;; *) EXC=$ROOT/$EXC ;; esac
mkdir -p "$(dirname "$EXC")" "$WORK/whl"
for d in .vx1 .vx2 .whl .whl2 .whl3 .rayw; do
  grep -qxF "/$d/" "$EXC" 2>/dev/null || echo "/$d/" >> "$EXC"
  rm -rf "${ROOT:?}/$d" && mkdir -p "$ROOT/$d"
done
# .kcache is not built here: it holds the kernel caches a device call packed (bench/gpu_session.sh's
# $OUT/kernels.tar.xz). Saved as $KCACHE after a session, the next checkout carries them again.
grep -qxF "/.kcache/" "$EXC" 2>/dev/null || echo "/.kcache/" >> "$EXC"
KCACHE=${KCACHE:-$HOME/.cache/grpo-gpu/kernels.tar.xz}
if [ -f "$KCACHE" ] && [ ! -f "$ROOT/.kcache/kernels.tar.xz" ]; then
  mkdir -p "$ROOT/.kcache" && cp "$KCACHE" "$ROOT/.kcache/" && echo ".kcache: the kernel caches of $KCACHE"
fi

pin() { echo "$PLAN" | awk -v n="$1" '$2 ~ "^"n"==" {print $2}'; }
# vLLM, stripped of what a GPU machine running offline vllm.LLM does not load.
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

# Ray, stripped.
R=$(pin ray); rm -rf "$WORK/ray" && mkdir -p "$WORK/ray"
"${PIPDL[@]}" -d "$WORK/ray" "$R"
( cd "$WORK/ray" && unzip -q ray-*.whl && rm -f ray-*.whl
  rm -rf ray/jars ray/dashboard/client/build ray/rllib ray/data ray/serve ray/tune ray/train ray/llm
  tar -cf - ray ray-*.dist-info | xz -9 -T2 > "$ROOT/.rayw/ray.tar.xz" )

# Every other carried package: the lock's wheel, or a wheel built here from its sdist; largest first
# into the first of .whl, .whl2, .whl3 it fits in within one call's budget (less 64 KiB for the folder).
rm -rf "$WORK/wheels" && mkdir -p "$WORK/wheels"
echo "$PLAN" | awk '$1 == "wheel" {print $2}' | xargs "${PIPDL[@]}" -d "$WORK/wheels"
for spec in $(echo "$PLAN" | awk '$1 == "build" {print $2}'); do
  python3 -m pip wheel -q --no-deps --no-binary :all: -w "$WORK/wheels" "$spec"
done
bins=(.whl .whl2 .whl3) fill=(0 0 0)
for w in $(ls -S "$WORK/wheels"/*.whl); do
  s=$(stat -c %s "$w") placed=
  for i in 0 1 2; do
    if [ $((fill[i] + s)) -le $((budget - 65536)) ]; then cp "$w" "$ROOT/${bins[i]}/"; fill[i]=$((fill[i] + s)); placed=1; break; fi
  done
  [ -n "$placed" ] || { echo "$(basename "$w") fits none of ${bins[*]} in one call's budget" >&2; exit 2; }
done
[ "$(ls "$WORK/wheels" | wc -l)" -eq "$(echo "$PLAN" | grep -c -e '^wheel ' -e '^build ')" ] \
  || { echo "the wheels fetched do not match the plan's packages" >&2; exit 2; }

# The calls: folders in this order, packed greedily under 64 MiB less the working tree that travels
# with every call (tracked and untracked-not-ignored files) and 4 MiB to spare.
echo "working tree $(( tree / 1048576 )) MiB; per call up to $(( budget / 1048576 )) MiB of carried folders"
call=() used=0 n=0
flush() { [ ${#call[@]} -eq 0 ] && return; n=$((n + 1)); echo "call $n: carry [${call[*]}]  ($(( used / 1048576 )) MiB): bash bench/gpu_unpack.sh ${call[*]}"; call=(); used=0; }
for d in .vx1 .vx2 .whl .whl2 .whl3 .rayw; do
  [ -n "$(ls -A "$ROOT/$d")" ] || continue
  s=$(du -sb "$ROOT/$d" | cut -f1)
  [ "$s" -le "$budget" ] || { echo "$d is $(( s / 1048576 )) MiB: over one call's budget" >&2; exit 2; }
  [ $((used + s)) -le "$budget" ] || flush
  call+=("$d"); used=$((used + s))
done
flush
echo "(the last call's command goes on after its unpack: ... && bash bench/gpu_session.sh PARTS)"
