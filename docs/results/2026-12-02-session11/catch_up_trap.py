import numpy as np
from specserve import LLM
from specserve.spec_decode.cost_model import choose_num_speculative_tokens
import os
llm = LLM(speculation_policy="adaptive", speculative_config={"method": "eagle", "model": os.path.expanduser("~/.cache/specserve/drafts/SmolLM2-135M-Instruct-prose+json+sql+rag-eagle")})
pol = llm.engine.spec_policy
print("target T(1) %.1f ms, draft T(1) %.2f, T(48) %.2f, T(150) %.2f ms" % tuple(1e3 * float(f(n)) for f, n in ((pol.target_cost, 1), (pol.draft_cost, 1), (pol.draft_cost, 48), (pol.draft_cost, 150))))
# per-position acceptance: flat, and falling as measured on prose (52% over K <= 2)
profiles = {"flat 0.5": [0.5] * 4, "flat 0.7": [0.7] * 4, "0.5,0.3,0.2,0.2": [0.5, 0.3, 0.2, 0.2],
            "0.4,0.25,0.2,0.2": [0.4, 0.25, 0.2, 0.2]}
for cu in (1, 48, 150, 300):
    for name, a in profiles.items():
        k, t, g = choose_num_speculative_tokens(np.array([a]), np.array([4]), 1, pol.target_cost, pol.draft_cost, np.array([cu]), None, contexts=np.array([cu + 10]))
        print(f"catch-up {cu:4d} acceptance {name:16s}: K={int(k[0])}")
