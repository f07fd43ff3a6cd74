#!/bin/bash
# alternate fresh engines: new (the checkout with second_pass_attempt.patch applied) and base (809bf4f, a worktree at /tmp/base); run from the checkout
export EAGLE=~/.cache/specserve/drafts/s32-eagle-r8
for i in 1 2 3 4 5; do
  for side in new base; do
    d=$PWD; [ $side = base ] && d=/tmp/base
    echo -n "$side $i: "
    (cd $d && PYTHONPATH=$d $OLDPWD/.venv/bin/python $OLDPWD/docs/results/2026-12-05-session32/eagle_lock.py 2>&1 | grep profile)
  done
done
