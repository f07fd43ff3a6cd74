import time, statistics
import specserve.engine.model_runner as mr
from specserve import LLM, SamplingParams
from specserve.bench.offline import make_prompts
llm = LLM(); e = llm.engine
tok = llm.get_tokenizer()
p = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
def prefill(ps):
    ids = [e.add_request(x, p).request_id for x in ps]
    t0 = time.perf_counter(); e.step(); t = time.perf_counter() - t0
    while e.has_unfinished_requests(): e.step()
    return t
for L in [64, 384, 512, 1024, 2048]:
    for nseq in [1]:
        res = {}
        for rep in range(3):
            for thr in (16, 100000):
                mr.SHORT_QUERY_LEN = thr
                ps = make_prompts(tok, nseq, L)
                # distinct prompts per run so the prefix cache does not hit
                ps = [[(t + 7 * rep + 13 * (thr > 16) + 1) % 49000 + 10 for t in x] if isinstance(x, list) else x for x in ps]
                res.setdefault(thr, []).append(prefill(ps))
        a, b = statistics.median(res[16]), statistics.median(res[100000])
        print(f"L={L:4d} x{nseq}: bmm path {a*1e3:6.1f} ms, kernel path {b*1e3:6.1f} ms, ratio {b/a:.2f}", flush=True)
