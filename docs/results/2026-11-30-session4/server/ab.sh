#!/bin/bash
# One A/B round of the server against the offline engine. usage: ab.sh IMPL ROUND (IMPL: h11 or
# httptools); writes $OUT_DIR/online_IMPL_ROUND.{json,txt} (default /tmp/s4).
cd "$(dirname "$0")/../../../.." || exit 1
export HF_HUB_OFFLINE=1
impl=$1; r=$2; out=${OUT_DIR:-/tmp/s4}; mkdir -p "$out"
.venv/bin/python docs/results/2026-11-30-session4/server/serve_impl.py "$impl" --port 8013 \
    --log-level warning > "$out/server_${impl}_$r.log" 2>&1 &
spid=$!
for _ in $(seq 60); do curl -sf http://127.0.0.1:8013/health >/dev/null && break; sleep 1; done
.venv/bin/specserve bench online --url http://127.0.0.1:8013 --workload prose \
    --concurrency 1,8,32 --max-tokens 64 --compare-offline --out "$out/online_${impl}_$r.json" \
    > "$out/online_${impl}_$r.txt" 2>&1
kill -TERM $spid; wait $spid
