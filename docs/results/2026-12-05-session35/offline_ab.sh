#!/bin/bash
# bench offline at the commit before the kernel (a worktree of bb3ad07 at $BASE) and at the
# checkout, alternated for three rounds. Outputs: offline_{base,new}-{1,2,3}.txt here.
#   git worktree add -f /tmp/base bb3ad07 && BASE=/tmp/base bash docs/results/2026-12-05-session35/offline_ab.sh
set -e
NEW=$(git rev-parse --show-toplevel); OUT=$NEW/docs/results/2026-12-05-session35
for r in 1 2 3; do
  for side in base new; do
    d=$BASE; [ $side = new ] && d=$NEW
    (cd $d && PYTHONPATH=$d $NEW/.venv/bin/python -m specserve.cli bench offline \
       --concurrency 1,4,8,16,32 --input-len 128 --output-len 64 > $OUT/offline_$side-$r.txt 2>&1)
  done
done
