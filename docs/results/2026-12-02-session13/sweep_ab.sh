#!/bin/bash
# the EAGLE sweep on this session's controller (working tree) and on a0d3e8f (/tmp/old-tree), one after the other
S="--proposers eagle --workloads prose,json,rag --concurrency 1,4,16,64 --policies off,static:2,static:4,batch-threshold:8,adaptive --repeats 2"
cd /work/main
/usr/bin/time -f "%e s" .venv/bin/specserve bench sweep $S --out /tmp/s13/sweep-new > /tmp/s13/sweep-new.txt 2>&1
cd /tmp/old-tree
PYTHONPATH=/tmp/old-tree /usr/bin/time -f "%e s" /work/main/.venv/bin/python -m specserve.cli bench sweep $S --out /tmp/s13/sweep-old > /tmp/s13/sweep-old.txt 2>&1
date
