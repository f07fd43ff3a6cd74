import sys, collections
import numpy as np
from specserve import LLM
from specserve.bench.lab import prepare_workload, run_workload
c = int(sys.argv[1]); pname = sys.argv[2]
llm = LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 4}, speculation_policy=pname, kv_cache_memory=1 << 30)
eng = llm.engine
wl = prepare_workload(eng, "prose", cap=32, scale=1.0)
by = collections.defaultdict(list)
orig = eng.step
def step(*a, **k):
    drafts = sum(len(r.spec_token_ids) for r in eng.scheduler.running)
    n = len(eng.scheduler.running)
    f0 = eng.stats.forward_time
    out = orig(*a, **k)
    by[(n, drafts)].append(eng.stats.forward_time - f0)
    return out
eng.step = step
import specserve.engine.llm_engine as le, time as _t
emit_t = collections.defaultdict(list); exec_t = collections.defaultdict(list)
_emit = le.emit_tokens
def emit(logits, params, gens, num_spec, *a):
    t = _t.perf_counter(); r = _emit(logits, params, gens, num_spec, *a); emit_t[sum(num_spec)].append(_t.perf_counter() - t); return r
le.emit_tokens = emit
_ex = eng.runner.execute
def ex(inputs, li, *a, **k):
    t = _t.perf_counter(); r = _ex(inputs, li, *a, **k); exec_t[len(li) - len(inputs.query_start)].append(_t.perf_counter() - t); return r
eng.runner.execute = ex
for r in range(3):
    run_workload(eng, wl, c, 8 * c, warm_shared_prefix=True)
for key in sorted(by):
    v = by[key]
    if len(v) >= 5 and key[0] == c:
        print(key, len(v), f"median {1e3*np.median(v):.2f} ms  p25 {1e3*np.percentile(v,25):.2f}")
for d in sorted(emit_t):
    if len(emit_t[d]) >= 5: print("drafts", d, "emit median %.3f ms" % (1e3*np.median(emit_t[d])), "execute median %.3f ms" % (1e3*np.median(exec_t[d])), len(emit_t[d]))
