"""The CPU argmax kernel (csrc/argmax.cpp) against torch.argmax: same indices on ties, NaN and
infinities, every row length around the vector widths, fp32 and bf16 rows (a bf16 row's argmax
is its fp32 copy's), and the fallback for other inputs."""

from __future__ import annotations

import pytest
import torch

from specserve.layers import paged_attention_ext as ext
from specserve.sample.argmax import argmax

needs_ext = pytest.mark.skipif(not ext.available(), reason="CPU extension unavailable")


@needs_ext
@pytest.mark.parametrize("n", [1, 7, 8, 15, 16, 17, 33, 49152, 49157])
def test_matches_torch_on_random_rows_and_ties(n):
    g = torch.Generator().manual_seed(n)
    for rows in (1, 3, 64):
        x = torch.randn(rows, n, generator=g)
        assert torch.equal(ext.module().argmax_rows(x), x.argmax(dim=-1))
        ties = torch.randint(-2, 3, (rows, n), generator=g).float()  # the first maximum wins
        assert torch.equal(ext.module().argmax_rows(ties), ties.argmax(dim=-1))
        for y in (x.bfloat16(), ties.bfloat16()):  # bf16 rounds many values onto ties
            assert torch.equal(ext.module().argmax_rows(y), y.float().argmax(dim=-1))


@needs_ext
def test_nan_infinities_and_signed_zeros_as_torch():
    x = torch.randn(6, 100)
    x[0, 50], x[0, 70] = float("nan"), float("nan")  # torch: the first NaN
    x[1] = -float("inf")
    x[2, 3], x[2, 9] = float("inf"), float("inf")
    x[3] = 0.0
    x[3, 5] = -0.0  # equal to +0.0: index 0 wins
    x[4, 99] = float("nan")  # a NaN in the scalar tail of the scan
    x[5, 97] = 1e30
    assert torch.equal(ext.module().argmax_rows(x), x.argmax(dim=-1))
    assert torch.equal(ext.module().argmax_rows(x.bfloat16()), x.bfloat16().float().argmax(dim=-1))


def test_other_inputs_fall_back_to_torch():
    x = torch.randn(8, 40)
    for y in (x.t(), x.half(), x[:, ::2]):  # non-contiguous, fp16, strided
        assert torch.equal(argmax(y), y.argmax(dim=-1))
    assert torch.equal(argmax(x), x.argmax(dim=-1))
