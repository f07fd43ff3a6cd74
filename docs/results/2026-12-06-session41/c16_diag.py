"""Where adaptive's time goes at rag c16 with the trained draft: its cache on vs off, interleaved with off."""
import os, statistics
from specserve.bench.lab import build_llm, proposer_config, warm_up, prepare_workload, run_workload
from specserve.bench.sweep import SweepSettings, parse_policy
C = int(os.environ.get("C", "16")); ROUNDS = int(os.environ.get("ROUNDS", "4"))
llm = build_llm(None, {"speculative_config": proposer_config("draft", 4, draft_model=os.environ["DRAFT"]), "speculation_policy": "adaptive",
                       "enable_prefix_caching": True, "max_num_seqs": 128})
eng = llm.engine; warm_up(eng)
pts = SweepSettings().points
w = prepare_workload(eng, "rag", pts.items("rag"), cap=pts.max_tokens_cap, scale=pts.max_tokens_scale)
variants = [("off", "off", True), ("adaptive+cache", "adaptive", True), ("adaptive-nocache", "adaptive", False)]
bm = eng.proposer.block_manager; installed = {}; res = {v[0]: [] for v in variants}
for r in range(ROUNDS):
    for name, pol, cache in variants[r % 3:] + variants[:r % 3]:
        if name in installed: eng.spec_policy = installed[name]
        else: eng.set_speculation_policy(*parse_policy(pol, 4)); installed[name] = eng.spec_policy
        bm.enable_prefix_caching = cache
        res[name].append(run_workload(eng, w, C, pts.num_prompts(C), pts.ignore_eos, warm_shared_prefix=True))
keys = ["output_tok_s", "num_steps", "step_time_s", "forward_time_s", "spec_time_s", "draft_time_s", "verify_time_s", "num_draft_tokens", "num_accepted_tokens", "num_prompt_tokens"]
for name, _, _ in variants:
    print(name)
    for x in res[name]: print("   " + "  ".join(f"{k.replace('_s','').replace('num_','')} {x[k]:.3f}" if isinstance(x[k], float) else f"{k.replace('num_','')} {x[k]}" for k in keys))
