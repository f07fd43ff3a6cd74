"""Session 11's catch-up trap, after the fix: the head's start-up cost profiles as the adaptive
policy now holds them (a chained forward, and a catch-up priced without logits), and the plan
for one request at several catch-ups, charged to one step (no horizon) and spread over the 63
tokens a 64-token request has left.

    python catch_up_price.py HEAD_DIR
"""
import sys

import numpy as np

from specserve import LLM
from specserve.spec_decode.cost_model import choose_num_speculative_tokens

llm = LLM(speculation_policy="adaptive",
          speculative_config={"method": "eagle", "model": sys.argv[1]})
pol = llm.engine.spec_policy
target, draft = pol.target_cost, pol.draft_cost
print(f"window (head context) {llm.engine.proposer.model.context}")
print(f"target T(1) {1e3 * target(1):.1f} ms; head chained forward T(1) {1e3 * draft(1):.2f} ms, "
      f"T(150) on that curve {1e3 * draft(150):.2f} ms")
for n in (48, 66, 150, 300):
    print(f"head forward catching up on {n:3d} tokens (one logits row): "
          f"{1e3 * draft.forward_time(n, 1):.2f} ms")
profiles = {"0.5,0.3,0.2,0.2": [0.5, 0.3, 0.2, 0.2], "0.4,0.25,0.2,0.2": [0.4, 0.25, 0.2, 0.2],
            "flat 0.5": [0.5] * 4}
for cu in (1, 48, 66, 150, 300):
    for name, a in profiles.items():
        ks = [int(choose_num_speculative_tokens(
            np.array([a]), np.array([4]), 1, target, draft, np.array([cu]), None,
            contexts=np.array([cu + 10]), horizon=h)[0][0])
            for h in (None, np.array([63]))]
        print(f"catch-up {cu:4d} acceptance {name:16s}: K = {ks[0]} charged to one step, "
              f"{ks[1]} spread over 63 tokens")
