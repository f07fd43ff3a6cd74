#!/bin/bash
# alternate base (HEAD worktree) and new (checkout): c64 offline tok/s (3 reps) and prefill step ms
for round in 1 2 3; do
  for side in base new; do
    d=/work/main; [ $side = base ] && d=/tmp/base
    out=$(cd $d && PYTHONPATH=$d /work/main/.venv/bin/python docs/results/2026-12-05-session31/c64_loop.py 64 3 2>&1 | grep "tok/s" | tr '\n' ' ')
    pf=$(cd $d && N=12 PYTHONPATH=$d /work/main/.venv/bin/python docs/results/2026-12-05-session31/prefill_loop.py 2>&1 | grep median | cut -c1-40)
    echo "round $round $side: $out | prefill $pf"
  done
done
