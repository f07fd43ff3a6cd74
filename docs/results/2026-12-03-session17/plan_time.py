import time, numpy as np
from specserve.spec_decode.cost_model import StepCostModel, DraftCostModel, choose_num_speculative_tokens
pts = [1, 2, 4, 8, 16, 32, 64, 128, 256]
tgt = StepCostModel(pts, [0.015 + 0.0006 * n for n in pts])
step = StepCostModel(pts, [0.0015 + 0.0001 * n for n in pts]); cu = StepCostModel(pts, [0.0015 + 0.00005 * n for n in pts])
dc = DraftCostModel(step, cu)
rng = np.random.default_rng(0)
for n in (2, 8, 32, 64):
    a = rng.uniform(0.5, 0.95, (n, 4)); k = np.full(n, 4)
    t0 = time.perf_counter()
    for _ in range(200):
        choose_num_speculative_tokens(a, k, n, tgt, dc, np.ones(n), None, horizon=np.full(n, 30.0))
    print(n, f"{(time.perf_counter() - t0) / 200 * 1e6:.0f} us/plan")
