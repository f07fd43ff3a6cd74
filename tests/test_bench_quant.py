"""`specserve bench quant`: one real mode measured in-process with tiny settings, the table."""

from __future__ import annotations

import math

import pytest

from specserve.bench.quant import QuantSettings, _measure_mode, format_quant, run_quant_bench


def test_unknown_mode_is_refused_before_anything_runs():
    with pytest.raises(ValueError, match="unknown modes"):
        run_quant_bench(["int3"], QuantSettings(), lambda desc, n: None)


def test_one_mode_end_to_end():
    s = QuantSettings(input_len=16, output_len=4, num_sequential=2, batch=3,
                      kv_cache_memory=64 << 20, ppl_tokens=80)
    row = _measure_mode("kv-int8", s, lambda desc, n: None)
    assert row["engine_kwargs"] == {"kv_cache_dtype": "int8"}
    # an 8-bit pool: 64 MiB / (30 layers * 2 * 3 heads * (64 + 2) bytes * 16 slots) blocks
    assert row["kv_blocks"] == (64 << 20) // (30 * 2 * 3 * 66 * 16)
    assert row["max_1k_seqs"] == row["kv_blocks"] * 16 // 1024
    assert 1 < row["perplexity"] < 1000 and math.isfinite(row["perplexity"])
    assert row["tok_s_c1"] > 0 and row["decode_tok_s_c1"] > 0 and row["tok_s_batch"] > 0
    assert [len(p) for p in row["prompts_c1"]] == [16, 16]
    table = format_quant({"settings": vars(s), "rows": [row], "llama_cpp": None})
    assert "kv-int8" in table and "llama.cpp: not measured" in table


def test_repetitions_are_reduced_to_medians():
    from specserve.bench.quant import _median_of

    reps = [{"mode": "x", "perplexity": 9.0, "tok_s_c1": v, "decode_tok_s_c1": 2 * v,
             "tok_s_batch": 3 * v} for v in (10.0, 30.0, 20.0)]
    row = _median_of(reps)
    assert (row["tok_s_c1"], row["decode_tok_s_c1"], row["tok_s_batch"]) == (20.0, 40.0, 60.0)
    assert row["perplexity"] == 9.0 and len(row["repetitions"]) == 3
