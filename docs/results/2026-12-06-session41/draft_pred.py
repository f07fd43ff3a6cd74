"""Predicted vs measured draft time per proposal (trained draft, rag, adaptive+cache), and the target's."""
import os
from specserve.bench.lab import build_llm, proposer_config, warm_up, prepare_workload, run_workload
from specserve.bench.sweep import SweepSettings
import specserve.spec_decode.policy as pol
C = int(os.environ.get("C", "16"))
llm = build_llm(None, {"speculative_config": proposer_config("draft", 4, draft_model=os.environ["DRAFT"]), "speculation_policy": "adaptive",
                       "enable_prefix_caching": True, "max_num_seqs": 128})
eng = llm.engine; warm_up(eng)
pts = SweepSettings().points
w = prepare_workload(eng, "rag", pts.items("rag"), cap=pts.max_tokens_cap, scale=pts.max_tokens_scale)
rows = []
orig = pol.AdaptivePolicy.observe_step
def spy(self, num_tokens, forward_s, draft_forwards, draft_s, runs=(), num_without_logits=0):
    if draft_forwards:
        dc = self.draft_cost
        ctx = getattr(dc, "runs_context_time", None)
        pred = sum(dc.forward_time(f[0], f[1]) + (ctx(f[2]) if ctx and len(f) > 2 else 0.0) for f in draft_forwards)
        rows.append((len(draft_forwards), sum(f[0] for f in draft_forwards), max(f[1] for f in draft_forwards), pred, draft_s, dc.scale))
    return orig(self, num_tokens, forward_s, draft_forwards, draft_s, runs, num_without_logits)
pol.AdaptivePolicy.observe_step = spy
for r in range(4):
    rows.clear()
    out = run_workload(eng, w, C, pts.num_prompts(C), pts.ignore_eos, warm_shared_prefix=True)
    print(f"round {r}: tok/s {out['output_tok_s']:.1f} drafted {out['num_draft_tokens']} accepted {out['num_accepted_tokens']} draft_time {out['draft_time_s']*1e3:.1f} ms")
    for f, t, n, p, m, sc in rows:
        print(f"   forwards {f} tokens {t:4d} seqs {n:2d}  predicted {p*1e3:6.2f} ms  measured {m*1e3:6.2f} ms  ratio {m/p:5.2f}  scale {sc:.2f}")
