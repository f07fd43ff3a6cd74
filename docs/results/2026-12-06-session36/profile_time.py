import time, torch, sys
torch.set_num_threads(2)
from specserve import LLM
import specserve.engine.llm_engine as le
import specserve.spec_decode.profiler as pr
orig = le.profile_forward
calls = []
orig_fastest = pr._fastest
def fastest(runner, shape, logits_rows, repeats):
    t = time.time(); r = orig_fastest(runner, shape, logits_rows, repeats)
    calls.append((sum(q for _, q in shape), len(shape), round(time.time() - t, 3), round(r * 1e3, 1)))
    return r
pr._fastest = fastest
def timed(r, *a, **k):
    calls.clear(); t = time.time(); m = orig(r, *a, **k)
    print('profile', r.cfg.num_layers if hasattr(r.cfg, 'num_layers') else '', round(time.time() - t, 2))
    print(' (tokens, seqs, wall s, fastest ms):', calls)
    return m
le.profile_forward = timed
dtype = sys.argv[1] if len(sys.argv) > 1 else 'bfloat16'
t = time.time()
spec = LLM(dtype=dtype, speculative_config={'method': 'ngram', 'num_speculative_tokens': 4})
print('build', round(time.time() - t, 2))
