#!/bin/bash
# alternate base/new: bench offline 128/128 at c32,64
for r in 1 2 3; do
  for side in base new; do
    d=/work/main; [ $side = base ] && d=/tmp/base
    out=$(cd $d && PYTHONPATH=$d /work/main/.venv/bin/python -m specserve.cli bench offline --concurrency 1,32,64 --input-len 128 --output-len 128 2>&1 | grep '^specserve' | awk '{printf "c%s %s tok/s TTFT %s; ", $2, $3, $4}')
    echo "round $r $side: $out"
  done
done
