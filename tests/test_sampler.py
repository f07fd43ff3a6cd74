"""Unit tests for token sampling (specserve/sample/sampler.py) and SamplingParams validation.
Small CPU tensors only; the statistical checks use fixed seeds, so they are deterministic."""

from __future__ import annotations

import math

import pytest
import torch

from specserve.sample.sampler import apply_top_k_top_p, compute_probs, sample
from specserve.sampling_params import SamplingParams

NEG_INF = float("-inf")


# ---- helpers ---------------------------------------------------------------------------------
def kept(row: torch.Tensor) -> set[int]:
    return set(torch.isfinite(row).nonzero().flatten().tolist())


def log_probs(probs: list[float]) -> torch.Tensor:
    return torch.tensor(probs, dtype=torch.float64).log().float()


def top_p_reference(probs: list[float], p: float) -> set[int]:
    """Smallest set of most likely tokens whose mass reaches p."""
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    out, mass = set(), 0.0
    for i in order:
        out.add(i)
        mass += probs[i]
        if mass >= p:
            break
    return out


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs.double() * counts.sum()
    return float(((counts.double() - expected) ** 2 / expected).sum())


def draw_many(logits: torch.Tensor, n: int, temperature: float, top_k: int = 0,
              top_p: float = 1.0) -> torch.Tensor:
    """Counts of n independent draws, as one [n, vocab] batch."""
    batch = logits.unsqueeze(0).expand(n, -1).contiguous()
    tokens = sample(batch, torch.full((n,), temperature), torch.full((n,), top_k),
                    torch.full((n,), top_p), [None] * n)
    return torch.bincount(tokens, minlength=logits.numel())


# ---- top-k / top-p -----------------------------------------------------------------------------
def test_no_filters_returns_the_logits():
    logits = torch.randn(3, 7)
    assert apply_top_k_top_p(logits, None, None) is logits


def test_top_k_keeps_exactly_the_k_highest_per_row():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 12, generator=g)
    ks = [1, 3, 0, 12, 50]  # 0 = off; more than the vocab = off
    out = apply_top_k_top_p(logits, torch.tensor(ks), None)
    for row, k in enumerate(ks):
        k_eff = 12 if k == 0 else min(k, 12)
        want = set(logits[row].topk(k_eff).indices.tolist())
        assert kept(out[row]) == want
        mask = torch.isfinite(out[row])
        assert torch.equal(out[row][mask], logits[row][mask])  # kept logits are untouched
        assert (out[row][~mask] == NEG_INF).all()


@pytest.mark.parametrize("p", [1e-6, 0.3, 0.45, 0.6, 0.75, 0.9, 0.97, 0.999, 1.0])
def test_top_p_keeps_the_smallest_prefix_reaching_p(p):
    probs = [0.05, 0.4, 0.02, 0.25, 0.2, 0.08]
    logits = log_probs(probs).unsqueeze(0)
    out = apply_top_k_top_p(logits, None, torch.tensor([p]))
    assert kept(out[0]) == top_p_reference(probs, p)
    assert len(kept(out[0])) >= 1


def test_top_p_per_row_and_always_keeps_one():
    probs = [0.1, 0.6, 0.3]
    logits = log_probs(probs).expand(4, -1)
    out = apply_top_k_top_p(logits, None, torch.tensor([1e-9, 0.5, 0.8, 1.0]))
    assert [kept(r) for r in out] == [{1}, {1}, {1, 2}, {0, 1, 2}]


@pytest.mark.parametrize("vocab,p,n_kept", [(10, 0.35, 4), (4, 0.5, 2), (4, 0.25, 1), (4, 0.75, 3)])
def test_top_p_on_a_uniform_row_keeps_a_prefix_of_the_right_size(vocab, p, n_kept):
    # Masses of 1/4 are exact in float: reaching p exactly is enough (no extra token).
    out = apply_top_k_top_p(torch.zeros(1, vocab), None, torch.tensor([p]))
    assert len(kept(out[0])) == n_kept


def test_top_p_applies_to_the_renormalised_top_k_distribution():
    probs = [0.4, 0.3, 0.2, 0.1]
    logits = log_probs(probs).expand(2, -1)
    out = apply_top_k_top_p(logits, torch.tensor([2, 0]), torch.tensor([0.5, 0.5]))
    assert kept(out[0]) == {0}  # 4/7 >= 0.5 after top-2
    assert kept(out[1]) == {0, 1}  # 0.4 < 0.5 without top-k


def test_top_k_keeps_ties_with_the_kth_whether_or_not_the_batch_sets_top_p():
    """bf16 logits tie often. A top-k row keeps every token tied with its k-th, in the path
    without top_p and in the sorted one that another row's top_p selects: its distribution
    does not depend on the batch."""
    row = torch.tensor([[3.0, 2.0, 1.0, 2.0, 0.5]])
    alone = apply_top_k_top_p(row, torch.tensor([2]), None)
    beside = apply_top_k_top_p(torch.cat([row, row]), torch.tensor([2, 0]),
                               torch.tensor([1.0, 0.5]))
    assert kept(alone[0]) == kept(beside[0]) == {0, 1, 3}
    assert torch.equal(alone[0], beside[0])


def test_a_row_without_top_p_keeps_its_tail_beside_a_row_with_it():
    """A neighbour's top_p sends every row through the sorted path, where fp32's cumsum of a
    peaked 49k-token row reaches 1.0 well before its tail: a top_p = 1 row lost thousands of
    tokens (and a seeded row's draw depended on its neighbours)."""
    torch.manual_seed(0)
    rows = torch.randn(2, 49152) * 10
    out = apply_top_k_top_p(rows, None, torch.tensor([1.0, 0.9]))
    assert torch.equal(out[0], rows[0])


# ---- sample ------------------------------------------------------------------------------------
def test_greedy_rows_are_argmax_in_a_mixed_batch():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(6, 50, generator=g)
    temperature = torch.tensor([0.0, 1.0, 0.0, 0.8, 0.0, 1e-7])
    gens = [None, torch.Generator().manual_seed(3), None, None, None, None]
    for _ in range(5):
        tokens = sample(logits, temperature, torch.tensor([0, 5, 0, 0, 1, 0]),
                        torch.tensor([1.0, 0.9, 1.0, 1.0, 1.0, 1.0]), gens)
        for row in (0, 2, 4, 5):
            assert tokens[row] == logits[row].argmax()


def test_a_greedy_requests_filters_do_not_send_the_sampling_rows_through_them(monkeypatch):
    # A greedy request keeps the model's default top-k / top-p (generation_config.json): they
    # switched the filters on for every row, a full-vocabulary sort per row per step.
    import specserve.sample.emit as emit_mod
    import specserve.sample.sampler as sampler_mod

    seen = []
    real = sampler_mod.apply_top_k_top_p

    def spy(logits, top_k, top_p):
        seen.append((top_k, top_p))
        return real(logits, top_k, top_p)

    monkeypatch.setattr(sampler_mod, "apply_top_k_top_p", spy)
    params = [SamplingParams(temperature=0, top_k=20, top_p=0.8), SamplingParams(temperature=1)]
    gens = [None, torch.Generator().manual_seed(1)]
    emit_mod.emit_tokens(torch.randn(2, 50), params, gens, [0, 0], [[], []], [None, None])
    emit_mod.emit_tokens(torch.randn(5, 50), params, gens, [3, 0], [[4, 5, 6], []],
                         [None, None])
    assert seen and all(k is None and p is None for k, p in seen)


def test_all_greedy_batch():
    logits = torch.randn(4, 9)
    tokens = sample(logits, torch.zeros(4), None, None, [None] * 4)
    assert torch.equal(tokens, logits.argmax(dim=-1))


def test_top_k_1_is_greedy_even_when_random():
    logits = torch.randn(8, 30)
    tokens = sample(logits, torch.ones(8), torch.ones(8, dtype=torch.long), None, [None] * 8)
    assert torch.equal(tokens, logits.argmax(dim=-1))


def _seeded_sequence(logits_row: torch.Tensor, seed: int, temperature: float, top_k: int,
                     top_p: float, others: list[tuple[float, int, float, int | None]],
                     position: int, steps: int = 20) -> list[int]:
    """Tokens drawn for the seeded row over `steps` calls, with `others` (temperature, top_k,
    top_p, seed) sharing the batch; the seeded row sits at `position`."""
    rows = list(others)
    rows.insert(position, (temperature, top_k, top_p, seed))
    gens = [None if s is None else torch.Generator().manual_seed(s) for *_, s in rows]
    g = torch.Generator().manual_seed(100)
    seq = []
    for _ in range(steps):
        logits = torch.randn(len(rows), logits_row.numel(), generator=g)
        logits[position] = logits_row
        top_k = torch.tensor([r[1] for r in rows]) if any(r[1] for r in rows) else None
        top_p = torch.tensor([r[2] for r in rows]) if any(r[2] < 1 for r in rows) else None
        tokens = sample(logits, torch.tensor([r[0] for r in rows]), top_k, top_p, gens)
        seq.append(int(tokens[position]))
    return seq


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (8, 0.95)])
def test_seeded_rows_are_reproducible_and_independent_of_the_batch(top_k, top_p):
    logits_row = torch.linspace(0.0, 2.0, 32)  # a flat-ish row: draws vary a lot
    target = (1.0, top_k, top_p)
    alone = _seeded_sequence(logits_row, 1234, *target, others=[], position=0)
    assert len(set(alone)) > 3  # the check has teeth: the sequence is not constant
    assert _seeded_sequence(logits_row, 1234, *target, others=[], position=0) == alone
    others = [(0.7, 0, 1.0, 1), (0.0, 0, 1.0, None), (1.3, 4, 0.5, None), (1.0, 0, 0.8, 1234)]
    torch.manual_seed(0)
    assert _seeded_sequence(logits_row, 1234, *target, others, position=2) == alone
    torch.manual_seed(1)  # the unseeded rows' global RNG state must not matter
    assert _seeded_sequence(logits_row, 1234, *target, others, position=4) == alone
    assert _seeded_sequence(logits_row, 4321, *target, others=[], position=0) != alone


# Pearson chi-square critical values at alpha = 1e-3 (scipy.stats.chi2.ppf(0.999, df)).
CHI2_CRIT_DF5 = 20.515
CHI2_CRIT_DF2 = 13.816


def test_sample_frequencies_match_softmax_with_temperature():
    torch.manual_seed(0)
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.5])
    temperature = 0.7
    counts = draw_many(logits, 40_000, temperature)
    assert chi_square(counts, (logits / temperature).softmax(-1)) < CHI2_CRIT_DF5
    # Negative control: the same draws are far from the untempered distribution.
    assert chi_square(counts, logits.softmax(-1)) > 10 * CHI2_CRIT_DF5


def test_sample_frequencies_with_top_k_and_top_p():
    torch.manual_seed(1)
    logits = torch.tensor([0.0, 1.5, -1.0, 1.0, 0.5, 2.0])
    # T = 1.2; top-4 keeps {5, 1, 3, 4}; top-p 0.8 then drops token 4 (mass before it > 0.8).
    probs = (logits / 1.2).softmax(-1)
    top4 = torch.zeros(6)
    top4[[5, 1, 3, 4]] = probs[[5, 1, 3, 4]] / probs[[5, 1, 3, 4]].sum()
    assert top4[[5, 1, 3]].sum() > 0.8 > top4[[5, 1]].sum()
    counts = draw_many(logits, 30_000, 1.2, top_k=4, top_p=0.8)
    assert counts[[0, 2, 4]].sum() == 0
    target = torch.zeros(6)
    target[[5, 1, 3]] = top4[[5, 1, 3]] / top4[[5, 1, 3]].sum()
    support = [5, 1, 3]
    assert chi_square(counts[support], target[support]) < CHI2_CRIT_DF2


def test_min_p_drops_tokens_below_its_share_of_the_likeliest():
    torch.manual_seed(3)
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.5])
    # min_p 0.2 at T = 1: kept where exp(x - 2) >= 0.2, i.e. x >= 2 + ln 0.2 = 0.39
    n = 30_000
    batch = logits.unsqueeze(0).expand(n, -1).contiguous()
    tokens = sample(batch, torch.ones(n), None, None, [None] * n, min_p=torch.full((n,), 0.2))
    counts = torch.bincount(tokens, minlength=6)
    assert counts[3:].sum() == 0
    support = [0, 1, 2]
    assert chi_square(counts[support], logits[support].softmax(-1)) < CHI2_CRIT_DF2
    # Negative control: without min_p the same seed reaches the tail.
    tokens = sample(batch, torch.ones(n), None, None, [None] * n)
    assert torch.bincount(tokens, minlength=6)[3:].sum() > 0.1 * n


def test_min_p_comes_after_temperature_and_before_top_k_and_top_p():
    """vLLM's order, against a float64 reference per row: min-p on the tempered distribution,
    then top-k, then top-p over what is left; rows with min_p 0 are untouched by it."""
    torch.manual_seed(4)
    logits = torch.randn(6, 50) * 3
    temperature = torch.tensor([0.5, 1.0, 1.5, 1.0, 0.7, 2.0])
    min_p = torch.tensor([0.0, 0.05, 0.3, 1.0, 0.1, 0.02])
    top_k = torch.tensor([0, 0, 5, 0, 20, 10])
    top_p = torch.tensor([0.9, 1.0, 0.8, 1.0, 0.5, 0.95])
    got = compute_probs(logits, temperature, top_k, top_p, min_p)
    for row in range(6):
        p = (logits[row].double() / float(temperature[row])).softmax(-1)
        p = torch.where(p >= float(min_p[row]) * p.max(), p, 0.0)
        if top_k[row]:
            p = torch.where(p >= p.topk(int(top_k[row])).values[-1], p, 0.0)
        p = p / p.sum()
        if top_p[row] < 1:
            sorted_p, order = p.sort(descending=True)
            keep = (sorted_p.cumsum(-1) - sorted_p) < float(top_p[row])
            p = torch.zeros_like(p).scatter(0, order, torch.where(keep, sorted_p, 0.0))
        assert got[row].double() == pytest.approx((p / p.sum()).tolist(), abs=1e-6)
    assert (got[3] > 0).sum() == 1  # min_p 1: the likeliest alone


def test_temperature_sharpens_and_flattens():
    torch.manual_seed(2)
    logits = torch.tensor([1.0, 0.0, -1.0])
    cold = draw_many(logits, 5000, 0.2)
    hot = draw_many(logits, 5000, 5.0)
    assert cold[0] > 0.99 * 5000 > hot[0]
    assert hot.min() > 0.2 * 5000


# ---- SamplingParams ----------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,field", [
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": -0.5}, "top_p"),
    ({"top_p": 1.01}, "top_p"),
    ({"top_p": float("nan")}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"top_k": 1.5}, "top_k"),
    ({"min_p": 1.5}, "min_p"),
    ({"min_p": -0.1}, "min_p"),
    ({"min_p": "0.1"}, "min_p"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": -3}, "max_tokens"),
    ({"max_tokens": 2.5}, "max_tokens"),
    ({"n": 0}, "n"),
    ({"n": -1}, "n"),
    ({"n": 1.0}, "n"),
    ({"stop": ""}, "stop"),
    ({"stop": ["ok", ""]}, "stop"),
    ({"stop": ["ok", 3]}, "stop"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 1.5}, "min_tokens"),
    ({"min_tokens": 20, "max_tokens": 16}, "min_tokens"),
    ({"structured_outputs": {"json": {}}}, "structured_outputs"),
    ({"logprobs": 21}, "logprobs"),
    ({"logprobs": 1.5}, "logprobs"),  # once accepted, then a crash of the step that used it
    ({"logprobs": "2"}, "logprobs"),
    ({"seed": 1.5}, "seed"),
    ({"num_speculative_tokens": 17}, "num_speculative_tokens"),
    # bool is an int in Python: n=True read as 1, ignore_eos="yes" as true
    ({"n": True}, "n"),
    ({"num_speculative_tokens": True}, "num_speculative_tokens"),
    ({"stop_token_ids": [True]}, "stop_token_ids"),
    ({"ignore_eos": "yes"}, "ignore_eos"),
    ({"skip_special_tokens": "no"}, "skip_special_tokens"),
])
def test_sampling_params_rejects_bad_values(kwargs, field):
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        SamplingParams(**kwargs)


def test_sampling_params_accepts_and_normalises_good_values():
    p = SamplingParams(temperature=0, top_p=1, top_k=-1, max_tokens=1, n=2, stop="###",
                       stop_token_ids=None)
    assert p.is_greedy and p.top_k == 0 and p.stop == ["###"] and p.stop_token_ids == []
    assert SamplingParams(max_tokens=None).max_tokens is None
    assert SamplingParams(stop=None).stop == []
    assert not SamplingParams(temperature=0.5).is_greedy


def test_validate_catches_mutation_after_construction():
    p = SamplingParams()
    p.temperature = -1.0
    with pytest.raises(ValueError, match="temperature"):
        p.validate()


def test_sampling_params_rejects_a_non_iterable_stop_with_value_error():
    with pytest.raises(ValueError, match="stop"):
        SamplingParams(stop=5)


def test_sampling_params_rejects_nan_temperature():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=math.nan)
