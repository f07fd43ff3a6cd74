#!/bin/bash
# old code (669e9d0, a worktree in /tmp/old-tree) and new (the working tree), the same cached head: lab rows, 3 repetitions
set -x
L="--max-tokens 64 --kv-cache-memory 2GiB --train-minutes 0 --repeats 3"
cd /work/main
.venv/bin/specserve bench lab --strategies vanilla,eagle-static,adaptive-eagle --workloads prose,json,sql --concurrency 1,32 $L --out /tmp/s12/ab-new > /tmp/s12/ab-new.txt 2>&1
cd /tmp/old-tree
PYTHONPATH=/tmp/old-tree /work/main/.venv/bin/python -m specserve.cli bench lab --strategies vanilla,eagle-static,adaptive-eagle --workloads prose,json,sql --concurrency 1,32 $L --out /tmp/s12/ab-old > /tmp/s12/ab-old.txt 2>&1
cd /work/main
.venv/bin/specserve bench lab --strategies vanilla,eagle-static,adaptive-eagle --workloads rag --concurrency 1 $L --out /tmp/s12/rag-new > /tmp/s12/rag-new.txt 2>&1
cd /tmp/old-tree
PYTHONPATH=/tmp/old-tree /work/main/.venv/bin/python -m specserve.cli bench lab --strategies vanilla,eagle-static,adaptive-eagle --workloads rag --concurrency 1 $L --out /tmp/s12/rag-old > /tmp/s12/rag-old.txt 2>&1
date
