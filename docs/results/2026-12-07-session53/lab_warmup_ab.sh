#!/bin/bash
# before (726cf3d) and after (HEAD): vanilla vs adaptive-ngram, prose then json, c1 and c32
cd /tmp
for round in 1 2; do
for v in old new; do
  if [ $v = old ]; then PP=/tmp/oldW; else PP=/work/main; fi
  PYTHONPATH=$PP HF_HUB_OFFLINE=1 /work/main/.venv/bin/python -m specserve.cli bench lab --strategies vanilla,adaptive-ngram --workloads prose,json --concurrency 1,32 --repeats 3 --max-tokens 64 --out /tmp/lab53/$v-r$round > /tmp/lab53/$v-r$round.log 2>&1
done
done
echo done > /tmp/lab53/DONE
