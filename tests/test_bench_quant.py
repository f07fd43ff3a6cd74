"""`specserve bench quant`: one real mode measured in-process with tiny settings, the table."""

from __future__ import annotations

import math

import pytest

from specserve.bench.quant import QuantSettings, _measure_mode, format_quant, run_quant_bench


def test_unknown_mode_is_refused_before_anything_runs():
    with pytest.raises(ValueError, match="unknown modes"):
        run_quant_bench(["int3"], QuantSettings(), lambda desc, n: None)


def _recording_llm(monkeypatch) -> list:
    """The LLMs _measure_mode builds, kept for a look at their engines afterwards."""
    import specserve.llm

    built = []

    class Recording(specserve.llm.LLM):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(specserve.llm, "LLM", Recording)
    return built


def test_one_mode_end_to_end(monkeypatch):
    s = QuantSettings(input_len=16, output_len=4, num_sequential=2, batch=3,
                      kv_cache_memory=64 << 20, ppl_tokens=80)
    built = _recording_llm(monkeypatch)
    row = _measure_mode("kv-int8", s, lambda desc, n: None)
    # The warm-up's prompt is the c=1 series' first: no prefill may come from the cache.
    (llm,) = built
    assert llm.engine.block_manager.enable_prefix_caching is False
    assert llm.engine.get_stats()["prefix_cache_hits"] == 0
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


def test_a_one_token_output_has_no_decode_rate_instead_of_a_crash():
    s = QuantSettings(input_len=16, output_len=1, num_sequential=1, batch=2,
                      kv_cache_memory=64 << 20, ppl_tokens=40)
    row = _measure_mode("bf16", s, lambda desc, n: None)
    assert row["decode_tok_s_c1"] is None and row["tok_s_c1"] > 0
    table = format_quant({"settings": vars(s), "rows": [row], "llama_cpp": None})
    assert "—" in table.splitlines()[1]


class FakeLlama:
    """llama-cpp-python's streaming completion: `chunks` token chunks, then the final chunk of
    no text with its finish_reason set."""

    def __init__(self, chunks: int):
        self.chunks = chunks

    def reset(self) -> None:
        pass

    def token_eos(self) -> int:
        return 1

    def create_completion(self, prompt, max_tokens, temperature, logit_bias, stream):
        yield from ({"choices": [{"text": "a", "finish_reason": None}]}
                    for _ in range(min(self.chunks, max_tokens)))
        yield {"choices": [{"text": "", "finish_reason": "length"}]}


def test_llama_cpp_one_chunk_replies_have_no_decode_rate(monkeypatch):
    """The final empty chunk is not a token: a one-token reply has no interval to time (it had
    one ~0 s interval, and decode tok/s was huge), and the table shows "—", not a crash."""
    from specserve.bench import baselines
    from specserve.bench.quant import _measure_llama_cpp

    monkeypatch.setattr(baselines, "load_llama_cpp", lambda *a, **kw: FakeLlama(1))
    s = QuantSettings(output_len=4, num_sequential=2)
    lcpp = _measure_llama_cpp([[5, 6], [7, 8]], s, lambda desc, n: None)
    assert lcpp["decode_tok_s_c1"] is None and lcpp["tok_s_c1"] > 0
    monkeypatch.setattr(baselines, "load_llama_cpp", lambda *a, **kw: FakeLlama(4))
    assert _measure_llama_cpp([[5, 6], [7, 8]], s, lambda desc, n: None)["decode_tok_s_c1"] > 0
    row = {"mode": "int8", "dtype": "bfloat16", "weight_bytes": 1 << 20, "kv_blocks": 4,
           "max_1k_seqs": 0, "perplexity": 10.0, "tok_s_c1": 5.0, "decode_tok_s_c1": 6.0,
           "tok_s_batch": 7.0}
    table = format_quant({"settings": vars(s), "rows": [row], "llama_cpp": lcpp})
    assert "x / —" in table.splitlines()[1]


def test_per_second_and_medians_skip_missing_rates():
    from specserve.bench.quant import _median_of, per_second

    assert per_second([None, None]) is None and per_second([0.0]) is None
    assert per_second([20.0, None, 10.0]) == pytest.approx(1e3 / 15)
    reps = [{"mode": "x", "tok_s_c1": 1.0, "decode_tok_s_c1": None, "tok_s_batch": 2.0}] * 2
    assert _median_of(reps)["decode_tok_s_c1"] is None


def test_the_quality_reference_is_labelled_with_the_dtype_it_ran_in():
    from specserve.bench.quality import format_quality

    row = {"config": {}, "dtype": "float32", "weight_mb": 1.0, "kv_blocks": 1,
           "perplexity": 9.0, "ppl_change_pct": 0.0, "first_divergence_mean": 64.0,
           "first_divergence_min": 64}
    quant_row = {**row, "config": {"quantization": "int8"}, "dtype": "bfloat16"}
    lines = format_quality([row, quant_row]).splitlines()
    assert lines[1].startswith("float32 (reference)") and "bf16" not in lines[1]
    assert lines[2].startswith("quantization=int8")
