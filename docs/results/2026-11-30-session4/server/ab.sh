#!/bin/bash
# usage: ab.sh IMPL ROUND
cd /work/main
export HF_HUB_OFFLINE=1
impl=$1; r=$2
.venv/bin/python /tmp/s4/serve_impl.py $impl --port 8013 --log-level warning > /tmp/s4/server_$impl_$r.log 2>&1 &
spid=$!
for i in $(seq 60); do curl -sf http://127.0.0.1:8013/health >/dev/null && break; sleep 1; done
.venv/bin/specserve bench online --url http://127.0.0.1:8013 --workload prose --concurrency 1,8,32 --max-tokens 64 --compare-offline --out /tmp/s4/online_${impl}_$r.json > /tmp/s4/online_${impl}_$r.txt 2>&1
kill -TERM $spid; wait $spid
