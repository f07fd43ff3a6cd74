import random, sys
sys.path.insert(0, "tests")
from types import SimpleNamespace
from specserve.spec_decode.cost_model import StepCostModel
from specserve.spec_decode.policy import build_policy
K_MAX = 4
def fake_request(request_id):
    return SimpleNamespace(request_id=request_id, params=SimpleNamespace(num_speculative_tokens=None), num_tokens=100, max_tokens=256, num_output_tokens=0)
def head_cost():
    target = StepCostModel([1, 4, 16, 64], [0.018, 0.018, 0.034, 0.1])
    step = StepCostModel([1, 4, 16, 64], [0.001, 0.0012, 0.0024, 0.0072])
    body = StepCostModel([1, 16, 64, 256, 1024], [4e-4 + 3e-5 * n for n in (1, 16, 64, 256, 1024)])
    return target, StepCostModel(step.x.tolist(), step.y.tolist(), chunk=body)
def dear_head_cost():
    target, draft = head_cost()
    return target, StepCostModel(draft.x.tolist(), [3.6 * t for t in draft.y.tolist()], chunk=draft.chunk)
src = open("tests/test_adaptive.py").read()
i = src.index("def run_alone"); j = src.index("def test_a_draft_network_tries_again")
exec(src[i:j])
target, draft = dear_head_cost()
print("good", [round(drafting_share(build_policy("adaptive", K_MAX, target, draft), 0.40, s), 2) for s in range(4)])
print("poor", [round(drafting_share(build_policy("adaptive", K_MAX, target, draft), 0.05, s), 2) for s in range(4)])
target, draft = head_cost()
reqs = [fake_request("a"), fake_request("b")]
for n in (3, 300):
    policy = build_policy("adaptive", K_MAX, target, draft)
    for _ in range(40): policy.acceptance.observe("earlier", 1, 1)
    for _ in range(n): policy.acceptance.observe("earlier", 2, 1)
    print("second guesses", n, sum(max(policy.choose(reqs, 2, 2, [1, 1])) > 1 for _ in range(200)))
