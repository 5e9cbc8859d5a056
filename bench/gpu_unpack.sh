#!/usr/bin/env bash
# On the lent GPU machine: unpack carried folders (bench/gpu_prepare.sh made them) into /tmp/site.
# usage: bash bench/gpu_unpack.sh DIR [DIR ...]     e.g. bash bench/gpu_unpack.sh .vx2 .whl
# *.tar.xz are extracted, *.whl installed (pip --no-index --no-deps --target); FLA's two wheels go to
# /tmp/site_fla instead (the torch backend's workers run without FLA: bench/megatron_gpu_train.py).
# A folder unpacked before on this machine (same name and size) is skipped. The machine forgets
# everything when it goes cold (30 s after a call): a folder that needs an earlier one that is not
# there stops with "COLD MACHINE" (start again from .vx1).
set -euo pipefail
S=${SITE:-/tmp/site}; FLA=${SITE_FLA:-/tmp/site_fla}; mkdir -p "$S" "$FLA"
for D in "$@"; do
  D=${D%/}; name=$(basename "$D")
  [ -d "$D" ] || { echo "no folder $D here: name it in the call's carry"; exit 2; }
  case "$name" in
    .vx2) [ -f $S/vllm/_C_stable_libtorch.abi3.so ] || { echo "COLD MACHINE: .vx1 is not unpacked; start again from .vx1"; exit 3; } ;;
  esac
  size=$(du -sb "$D" | cut -f1)
  if [ "$(cat $S/.unpacked$name 2>/dev/null)" = "$size" ]; then echo "$D: unpacked already"; continue; fi
  t0=$(date +%s%N)
  for a in "$D"/*.tar.xz; do [ -e "$a" ] && tar -xJf "$a" -C $S; done
  main=$(ls "$D"/*.whl 2>/dev/null | grep -v -e /fla_core- -e /flash_linear_attention- || true)
  fla=$(ls "$D"/fla_core-*.whl "$D"/flash_linear_attention-*.whl 2>/dev/null || true)
  pip=("${PYTHON:-python3}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --root-user-action ignore)
  # pip --target --upgrade replaces a top-level folder that is already there: megatron_bridge (megatron/bridge)
  # would delete megatron_core's megatron/core. Each folder installs into its own stage, merged in after.
  install() { local to=$1; shift; local stage; stage=$(mktemp -d); "${pip[@]}" --target "$stage" "$@"; cp -a "$stage"/. "$to"/; rm -rf "$stage"; }
  [ -z "$main" ] || install $S $main
  [ -z "$fla" ] || install "$FLA" $fla
  echo "$size" > $S/.unpacked$name
  echo "unpacked $D in $(( ($(date +%s%N) - t0) / 1000000 )) ms; $S holds $(du -sm "$S" | cut -f1) MB"
done
