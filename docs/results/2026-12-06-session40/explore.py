import random, sys, os
sys.path.insert(0, os.getcwd())
import tests.test_adaptive as T
from specserve.spec_decode.policy import build_policy
import specserve.spec_decode.acceptance as A
target, draft = T.dear_head_cost()
for floor in (10.0, 20.0):
    A.FORGET_FLOOR = floor
    per_req = [0] * 40
    for seed in range(10):
        p = build_policy("adaptive", 4, target, draft); p.acceptance._rng = random.Random(seed)
        for i in range(40):
            req = T.fake_request(f"r{i}")
            for _ in range(32):
                k = p.choose([req], 1, 1, [1])[0]
                if k: p.observe_verification(req, k, 0); per_req[i] += 1
            p.forget(req)
    print(f"floor {floor}: plans drafting per 32-token request (mean of 10 seeds), requests 1-40:", [round(x / 10, 1) for x in per_req])
