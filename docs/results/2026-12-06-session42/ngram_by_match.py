"""First-guess acceptance of the n-gram proposer by the length of the suffix match that made the
guess, on the target's own greedy replies (the sweep's workloads, 32-token replies as the sweep
caps them, and 128-token ones). Teacher-forced: at every reply position, the guess from the
context so far against the token the target emitted next."""
import collections, sys
from specserve.llm import LLM
from specserve.sampling_params import SamplingParams
from specserve.bench.workloads import load_workload
from specserve.spec_decode.ngram import NgramIndex

llm = LLM(None)
eng = llm.engine
for cap in (32, 128):
    for wl in ("prose", "json", "rag"):
        items = load_workload(wl)
        prompts = [eng.apply_chat_template(i.messages) for i in items]
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=cap, ignore_eos=False))
        hit = collections.Counter(); tot = collections.Counter(); none = 0; pos = 0
        for p, o in zip(prompts, outs):
            toks = p + list(o.outputs[0].token_ids)
            for t in range(len(p), len(toks)):
                ctx = toks[:t]
                pos += 1
                found = 0
                for n in range(4, 0, -1):
                    idx = NgramIndex(n, n)
                    g = idx.lookup(ctx, 1)
                    if g:
                        found = n; break
                if not found:
                    none += 1; continue
                tot[found] += 1; hit[found] += g[0] == toks[t]
        print(f"cap {cap:3d} {wl:5s} positions {pos:5d} no guess {none/pos:5.1%}  " + "  ".join(
            f"n={n}: {tot[n]/pos:5.1%} of positions, accepted {hit[n]/max(tot[n],1):5.1%}" for n in (4, 3, 2, 1)), flush=True)
