"""Start-up profile of one forward's time against its number of tokens (for the cost model)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch

from specserve.engine.model_runner import ModelRunner
from specserve.spec_decode.cost_model import StepCostModel

PROFILE_POINTS = (1, 4, 16, 32, 64, 128, 256)


def profile_forward(runner: ModelRunner, points: tuple[int, ...] = PROFILE_POINTS,
                    context: int = 96, repeats: int = 1) -> StepCostModel:
    """Time decode-shaped forwards of n sequences x 1 token (n in points) at a fixed context.
    The fake sequences share the first blocks of the (still empty) pool: the garbage they
    write there is overwritten before any real request reads it."""
    bs = runner.block_size
    num_blocks = min(-(-context // bs), runner.num_blocks)
    context = min(context, num_blocks * bs)
    seq = SimpleNamespace(num_computed_tokens=context - 1, all_token_ids=[0] * context,
                          spec_token_ids=[], block_ids=list(range(num_blocks)))
    times = []
    for n in points:
        inputs = runner.prepare([(seq, 1)] * n)
        last = torch.arange(n)
        best = float("inf")
        for _ in range(repeats + 1):  # the first run warms up allocator and caches
            t0 = time.perf_counter()
            runner.execute(inputs, last)
            best = min(best, time.perf_counter() - t0)
        times.append(best)
    return StepCostModel(list(points), times)
