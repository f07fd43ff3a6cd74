"""Start-up profile of one forward's time against its number of tokens (for the cost model).

The profile must resolve the slope the controller trades on: on this machine the embedded model
is compute-bound from about 4 tokens (+0.55 ms per token), and a sparse profile (1, 4, 16, ...)
with one timing per point read it as nearly flat between 4 and 16 — the controller then bought
drafts that cost 4x what it believed. So: dense points where decode batches live, a warm-up
run and `repeats` timed runs per point, the fastest kept.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch

from specserve.engine.model_runner import ModelRunner
from specserve.spec_decode.cost_model import StepCostModel

PROFILE_POINTS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def profile_forward(runner: ModelRunner, points: tuple[int, ...] = PROFILE_POINTS,
                    context: int = 96, repeats: int = 3) -> StepCostModel:
    """Time decode-shaped forwards of n sequences x 1 token (n in points) at a fixed context,
    with logits for every token (as a verification step needs); the fastest of `repeats` runs
    per point (machine noise only ever adds time).

    Each fake sequence reads its own blocks of the (still empty) pool, wrapping around when the
    pool is small: sequences sharing one context read the same cache lines and made attention
    look half as expensive as it is. The garbage they write is overwritten before any real
    request reads it."""
    bs = runner.block_size
    per_seq = min(-(-context // bs), runner.num_blocks)
    context = min(context, per_seq * bs)

    def seq(i: int) -> SimpleNamespace:
        first = i * per_seq
        return SimpleNamespace(num_computed_tokens=context - 1, all_token_ids=[0] * context,
                               spec_token_ids=[], block_ids=[(first + b) % runner.num_blocks
                                                             for b in range(per_seq)])

    # One forward of the largest point first: allocator, kernel selection and (on a GPU) clocks
    # that idle low would otherwise inflate the first points and flatten the whole curve.
    runner.execute(runner.prepare([(seq(i), 1) for i in range(max(points))]),
                   torch.arange(max(points)))
    times = []
    for n in points:  # ascending, each point's runs back to back: a forward right after a much
        inputs = runner.prepare([(seq(i), 1) for i in range(n)])  # bigger one runs ~20% slow
        rows = torch.arange(n)
        runs = []
        for _ in range(repeats + 1):  # the first run warms up the allocator and caches
            t0 = time.perf_counter()
            runner.execute(inputs, rows)
            runs.append(time.perf_counter() - t0)
        times.append(min(runs[1:]))
    return StepCostModel(list(points), times)
