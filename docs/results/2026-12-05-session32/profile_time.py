"""Start-up profile time of the target and its curve at 1-8 tokens (an n-gram engine: the
target's profile only). Run at each side of an A/B."""
from specserve import LLM

e = LLM(speculative_config={"method": "ngram"}, speculation_policy="adaptive").engine
tc = e.spec_policy.target_cost
print(f"profile {e.profile_time:.2f} s; T(n) ms:",
      {n: round(float(tc(n)) * 1e3, 2) for n in (1, 2, 3, 4, 6, 8, 16)})
