#!/usr/bin/env bash
# Puts an older commit's packages and bench into .old/ (ignored), for gpu_session.sh's oldmfu part:
# that commit's own code profiled beside HEAD's in the same device call (issue 46, item 2).
#   bash bench/gpu_old_tree.sh 218c44e     # then carry [".old"] in the call with oldmfu=SPEC
set -euo pipefail
cd "$(dirname "$0")/.."
commit=$(git rev-parse --short "${1:?usage: gpu_old_tree.sh COMMIT}")
rm -rf .old && mkdir .old
git archive "$commit" packages bench | tar -x -C .old
echo "$commit" > .old/COMMIT
grep -qx '/.old' .git/info/exclude 2>/dev/null || echo '/.old' >> .git/info/exclude
echo ".old: $commit ($(du -sh .old | cut -f1))"
