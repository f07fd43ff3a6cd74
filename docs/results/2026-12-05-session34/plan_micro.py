"""One 4-request plan captured from prose at concurrency 4, then timed in a loop (caches warm),
and cProfiled: what the same calls cost when nothing runs between them."""
import time, os, copy, cProfile, pstats, timeit
import numpy as np
from specserve import LLM
from specserve.bench.lab import prepare_workload, proposer_config, run_workload, warm_up
import specserve.spec_decode.policy as P
llm = LLM(speculative_config=proposer_config("ngram", 4), speculation_policy="adaptive")
e = llm.engine; warm_up(e)
w = prepare_workload(e, "prose", cap=32)
caught=[]
orig=P.choose_num_speculative_tokens
def g(*a, **k):
    if len(a[0])==4 and len(caught)<50: caught.append((copy.deepcopy(a),copy.deepcopy(k)))
    return orig(*a, **k)
P.choose_num_speculative_tokens=g
ests=[]
origle=e.spec_policy.acceptance.lower_estimates
def le(ids, *a, **k):
    if len(ids)==4: ests.append(list(ids))
    return origle(ids,*a,**k)
e.spec_policy.acceptance.lower_estimates=le
run_workload(e, w, 4, 32)
a,k=caught[-1]
print("alphas", a[0], "kmax", a[1], "nbase", a[2], {x:v for x,v in k.items() if x!='contexts'})
n=2000
t=timeit.timeit(lambda: orig(*a,**k), number=n)/n; print(f"cnst {t*1e6:.1f} us")
acc=e.spec_policy.acceptance
ids=ests[-1]
t=timeit.timeit(lambda: origle(ids), number=n)/n; print(f"lower_estimates {t*1e6:.1f} us")
t=timeit.timeit(lambda: acc._estimates_and_weights(ids), number=n)/n; print(f"est_w {t*1e6:.1f} us")
t=timeit.timeit(lambda: acc.global_rates, number=n)/n; print(f"global_rates {t*1e6:.1f} us")
t=timeit.timeit(lambda: np.array([1.0,2.0]), number=n)/n; print(f"np.array {t*1e6:.2f} us")
pr=cProfile.Profile(); pr.enable()
for _ in range(500): orig(*a,**k)
pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(25)
