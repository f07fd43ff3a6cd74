"""Start-up profile of one forward's time against its number of tokens and its context (for
the cost model).

The profile must resolve the slope the controller trades on: on this machine the embedded model
is compute-bound from about 4 tokens (+0.55 ms per token), and a sparse profile (1, 4, 16, ...)
with one timing per point read it as nearly flat between 4 and 16 — the controller then bought
drafts that cost 4x what it believed. So: dense points where decode batches live, a warm-up
run and up to `repeats` timed runs per point, the fastest kept (on a CPU the warm-up is one of
the candidates: see _fastest).

The context terms come from four more shapes: S sequences x 1 and x Q tokens, each at the
short profile context and at a long one. Lengthening the context adds S * dctx * (kv + attn)
seconds to the first pair and S * dctx * (kv + Q * attn) to the second, which gives both
coefficients.
"""

from __future__ import annotations

import statistics
import time
from types import SimpleNamespace

import torch

from specserve.engine.model_runner import ModelRunner
from specserve.spec_decode.cost_model import StepCostModel, fit_knee_curve

PROFILE_POINTS = (1, 2, 3, 4, 6, 8, 12, 16, 17, 24, 32, 33, 48, 64, 65, 96, 128, 129, 192, 256)
# Row counts after which a forward may cost a step more (fit_knee_curve), each profiled on both
# sides: kernels tile rows by 16 and make passes of 32 or 64 (AMX: a tile holds 16 rows and the
# linear streams the weights once per 32; GPU GEMMs pick tiles of 16-128 rows). On this CPU the
# 17th row adds 1.8 ms and the 33rd 6 ms to a 23 ms step (docs/performance.md, session 28).
ROW_STEPS = (16, 32, 64, 128)
# Timed runs of one point stop early once they add up to this: a forward that long averages the
# noise out by itself, and on a slow CPU (an fp32 256-token forward takes ~0.7 s on a 2-core
# Zen 3) three of each large point made the profile take 16 s.
POINT_BUDGET_S = 0.25
# Points up to here are timed in passes over all of them (_small_points), at most this many
# passes and, past the third, within this budget: a pass is ~80 ms on a 2-core Zen 5 in bf16.
SMALL_POINTS_MAX = 16
SMALL_POINT_PASSES = 15
SMALL_POINTS_BUDGET_S = 1.5
CONTEXT_SEQS, CONTEXT_QUERY = 8, 4  # the context shapes: S sequences, 1 or Q tokens each
# Tokens without logits (prefill chunks; a draft's catch-up on a prompt, or on a stretch
# without speculation): n tokens as sequences of at most CHUNK_SEQ_LEN, so that the curve is
# the tokens' own cost and attention past the profile's context stays with the context terms.
# Timed as one sequence, 1,024 tokens took 482 ms (attention quadratic in its length) where a
# step of 2,048 prefill tokens from many prompts took 350-370, and the curve priced that step
# at 1,030 ms.
CHUNK_POINTS = (1, 16, 64, 256, 1024)
CHUNK_SEQ_LEN = 64


def _fake_seq(runner: ModelRunner, i: int, ctx: int, q: int = 1) -> SimpleNamespace:
    """Fake sequence i: ctx tokens of which the last q are scheduled. Each reads its own blocks of
    the (still empty) pool, wrapping around when the pool is small: sequences sharing one
    context read the same cache lines and made attention look half as expensive as it is. The
    garbage they write is overwritten before any real request reads it."""
    bs = runner.block_size
    per_seq = -(-ctx // bs)
    first = i * per_seq
    return SimpleNamespace(num_computed_tokens=ctx - q, all_token_ids=[0] * ctx,
                           spec_token_ids=[], block_ids=[(first + b) % runner.num_blocks
                                                         for b in range(per_seq)])


def _fastest(runner: ModelRunner, shape: list[tuple[SimpleNamespace, int]],
             logits_rows: torch.Tensor, repeats: int) -> float:
    """The fastest of up to `repeats` timed forwards of one shape after a warm-up (machine noise
    only ever adds time; POINT_BUDGET_S caps long points).

    On a CPU the warm-up is timed too, and counts: once the profile's first (largest) forward
    has run, a shape's first forward there costs what the next ones do (2-core Zen 3, bf16: 256
    tokens 0.62 s against 0.61, a 1,024-token chunk 1.60 against 1.60), so a point that long is
    not run again. That took a third off the profile's 14 s there. A GPU's first call of a
    shape may still pick or load kernels, and its warm-up is thrown away."""
    inputs = runner.prepare(shape)

    def timed() -> float:
        t0 = time.perf_counter()
        runner.execute(inputs, logits_rows)
        return time.perf_counter() - t0

    warm_up = timed()
    runs = [warm_up] if runner.device.type == "cpu" else []
    for _ in range(repeats):
        if sum(runs) >= POINT_BUDGET_S:
            break
        runs.append(timed())
    return min(runs)


def _small_points(runner: ModelRunner, shapes: list[list[tuple[SimpleNamespace, int]]],
                  passes: int = SMALL_POINT_PASSES, budget_s: float = SMALL_POINTS_BUDGET_S
                  ) -> list[float]:
    """Times of the small shapes (the smallest first), from passes over all of them
    in turn: the first shape's fastest time, times each shape's median ratio to the first one
    within a pass.

    A decode batch's drafts are priced by T(n + K) - T(n) at small n, a few percent of a step,
    and VM noise moves single forwards by 10%. Timed point by point, the fastest of a few runs
    each, two start-up profiles of a 2-core Zen 5 read T(2) / T(1) as 1.00 and 1.20-1.38 where
    forwards taken in turn read 1.03-1.11 (docs/results/2026-12-06-session43/profile_small.txt),
    and the fitted curve priced the first three drafts at concurrency 1 as free: the controller
    drafted three guesses a step at 7% acceptance. Ratios within one pass share that pass's
    speed; the median drops the passes an interruption hit. The level stays the fastest run's,
    as for the larger points. Live decoding alternates these shapes in the same way."""
    inputs = [runner.prepare(shape) for shape in shapes]
    rows = [torch.arange(sum(q for _, q in shape)) for shape in shapes]
    for inp, r in zip(inputs, rows, strict=True):  # a warm-up of each shape
        runner.execute(inp, r)
    runs: list[list[float]] = []
    start = time.perf_counter()
    while len(runs) < passes and (len(runs) < 3 or time.perf_counter() - start < budget_s):
        one_pass = []
        for inp, r in zip(inputs, rows, strict=True):
            t0 = time.perf_counter()
            runner.execute(inp, r)
            one_pass.append(time.perf_counter() - t0)
        runs.append(one_pass)
    first = min(p[0] for p in runs)
    return [first * statistics.median(p[i] / p[0] for p in runs) for i in range(len(shapes))]


def _context_limit(runner: ModelRunner) -> int:
    """The pool must hold one sequence's blocks and the model its positions."""
    return min(runner.num_blocks * runner.block_size, runner.cfg.max_position)


def profile_forward(runner: ModelRunner, points: tuple[int, ...] = PROFILE_POINTS,
                    context: int = 96, long_context: int = 1024, repeats: int = 3,
                    chunk_points: tuple[int, ...] = CHUNK_POINTS) -> StepCostModel:
    """Time decode-shaped forwards of n sequences x 1 token (n in points) at a fixed context,
    with logits for every token (as a verification step needs): points up to SMALL_POINTS_MAX
    in passes over all of them (_small_points), the larger ones the fastest of a few runs each
    (_fastest). Then the context shapes (module docstring), and the chunk curve: n tokens
    in sequences of CHUNK_SEQ_LEN, logits for the last token only (n in chunk_points). The same
    profile serves the target and a draft network (its chained forwards, and its catch-up on
    the chunk curve)."""
    def fastest(shape: list[tuple[SimpleNamespace, int]]) -> float:
        return _fastest(runner, shape, torch.arange(sum(q for _, q in shape)), repeats)

    def seq(i: int, ctx: int, q: int = 1) -> SimpleNamespace:
        return _fake_seq(runner, i, ctx, q)

    bs = runner.block_size
    # Contexts shrink to fit small pools and short-context models.
    limit = _context_limit(runner)
    context = min(context, limit)
    long_context = min(long_context, limit)

    def decode_shape(n: int, ctx: int = context) -> list[tuple[SimpleNamespace, int]]:
        return [(seq(i, ctx), 1) for i in range(n)]

    # One forward of the largest point first: allocator, kernel selection and (on a GPU) clocks
    # that idle low would otherwise inflate the first points and flatten the whole curve.
    runner.execute(runner.prepare(decode_shape(max(points))), torch.arange(max(points)))
    small = sorted(n for n in points if n <= SMALL_POINTS_MAX)
    timed = {}
    if small:
        timed = dict(zip(small, _small_points(runner, [decode_shape(n) for n in small]),
                         strict=True))
    # The rest ascending, each point's runs back to back: a forward right after a much bigger
    # one runs ~20% slow.
    for n in sorted(points):
        if n > SMALL_POINTS_MAX:
            timed[n] = fastest(decode_shape(n))
    times = [timed[n] for n in points]
    kv_read_s = attention_s = 0.0
    extra = long_context - context
    if extra >= 4 * bs:
        s, q = CONTEXT_SEQS, CONTEXT_QUERY
        d1 = (fastest(decode_shape(s, long_context)) - fastest(decode_shape(s))) / (s * extra)
        dq = (fastest([(seq(i, long_context, q), q) for i in range(s)])
              - fastest([(seq(i, context, q), q) for i in range(s)])) / (s * extra)
        attention_s = max((dq - d1) / (q - 1), 0.0)
        kv_read_s = max(d1 - attention_s, 0.0)

    def chunk_shape(n: int) -> list[tuple[SimpleNamespace, int]]:
        seq_len = min(CHUNK_SEQ_LEN, limit)  # a model's positions may end sooner
        full, rest = divmod(n, seq_len)
        lens = [seq_len] * full + [rest] * bool(rest)
        return [(seq(i, q, q), q) for i, q in enumerate(lens)]

    chunk = list(chunk_points)
    chunk_times = [_fastest(runner, chunk_shape(n), torch.tensor([n - 1]), repeats)
                   for n in chunk]
    return StepCostModel(list(points), fit_knee_curve(list(points), times, ROW_STEPS),
                         kv_read_s=kv_read_s, attention_s=attention_s, base_context=context,
                         chunk=StepCostModel(chunk, fit_knee_curve(chunk, chunk_times)))
