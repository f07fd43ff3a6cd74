#!/bin/bash
# base, then new (not alternated): one lab each; every repeat builds fresh engines, so 3 profiles per strategy
# base = 1542e4c (git worktree at /tmp/base), new = this session's fit (b80c134's code, uncommitted then).
# Each side's results.json is copied here as lab-ab/base-1542e4c.json and lab-ab/new.json.
# Per-run tok/s, drafts and prices: python docs/results/2026-12-05-session32/lab_steps.py lab-ab/new.json
for side in base new; do
  if [ $side = base ]; then d=/tmp/base; else d=/work/main; fi
  cd $d && PYTHONPATH=$d HF_HUB_OFFLINE=1 /work/main/.venv/bin/specserve bench lab \
    --eagle-model ~/.cache/specserve/drafts/s32-eagle-r8 \
    --strategies vanilla,eagle-static,adaptive-eagle,adaptive-ngram --workloads prose,json \
    --concurrency 1 --repeats 3 --max-tokens 64 --out /tmp/ab/lab-$side > /tmp/ab/lab-$side.log 2>&1
  echo "$side done $(date)" >> /tmp/ab/progress
done
