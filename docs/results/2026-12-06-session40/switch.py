import random, sys, os
sys.path.insert(0, os.getcwd())
import tests.test_adaptive as T
from specserve.spec_decode.policy import build_policy
target, draft = T.head_cost()
reqs = [T.fake_request("a"), T.fake_request("b")]
def second(n, seed):
    p = build_policy("adaptive", 4, target, draft); p.acceptance._rng = random.Random(seed)
    for _ in range(40): p.acceptance.observe("earlier", 1, 1)
    for _ in range(n): p.acceptance.observe("earlier", 2, 1)
    return sum(max(p.choose(reqs, 2, 2, [1, 1])) > 1 for _ in range(200))

# switch: prose alpha .1 then json .6, dear head (break-even ~.24)
t2, d2 = T.dear_head_cost()
def switch(seed):
    rng = random.Random(seed + 100)
    p = build_policy("adaptive", 4, t2, d2); p.acceptance._rng = random.Random(seed)
    out = []
    for alpha, n in ((0.1, 20), (0.6, 10)):
        share = []
        for i in range(n):
            req = T.fake_request(f"{alpha}-{i}"); emitted = 0
            while emitted < 48:
                k = p.choose([req], 1, 1, [1])[0]
                acc = 0
                while acc < k and rng.random() < alpha: acc += 1
                if k: p.observe_verification(req, k, acc)
                share.append(k > 0); emitted += 1 + acc
            p.forget(req)
        out.append(round(sum(share[len(share)//2:]) / len(share[len(share)//2:]), 2))
    return out
r = [switch(s)[1] for s in range(12)]; print("switch json shares", r, "mean", round(sum(r)/len(r), 2))
