"""Unit tests for the server's Prometheus metrics (specserve/server/metrics.py), fed RequestOutputs
built here (no server); the tokens-per-step histogram reads the offline engine's counts."""

from __future__ import annotations

import time

import pytest
from test_server import parse_metrics

from specserve.config import CacheConfig, SchedulerConfig
from specserve.engine.block_manager import BlockManager
from specserve.engine.output_processor import make_output
from specserve.engine.request import Request
from specserve.engine.scheduler import Scheduler
from specserve.outputs import CompletionOutput, RequestMetrics, RequestOutput
from specserve.sampling_params import SamplingParams
from specserve.server.metrics import ServerMetrics, buckets_1_2_5

# Times on the engine's clock; binary fractions, so that sums compare exactly.
ARRIVAL, SCHEDULED, FIRST_TOKEN, FINISHED = 100.0, 100.25, 101.0, 103.5
ITL = 0.015625


def make_out(num_prompt: int = 10, num_tokens: int = 1, *, reason: str | None = None,
             num_cached: int = 0, arrival: float = ARRIVAL, rid: str = "r") -> RequestOutput:
    """An output of a request that has num_tokens tokens so far; finished if reason is given."""
    metrics = RequestMetrics(arrival, arrival + FIRST_TOKEN - ARRIVAL,
                             arrival + FINISHED - ARRIVAL if reason else None,
                             num_cached_tokens=num_cached,
                             scheduled_time=arrival + SCHEDULED - ARRIVAL)
    completion = CompletionOutput(0, "", list(range(num_tokens)), finish_reason=reason)
    return RequestOutput(rid, None, list(range(num_prompt)), [completion], reason is not None,
                         metrics)


def scrape(metrics: ServerMetrics) -> dict[str, float]:
    return parse_metrics(metrics.render().decode())


def serve(metrics: ServerMetrics, outs: list[RequestOutput]) -> None:
    """Deliver one request's outputs in order, as the event loop does."""
    for i, out in enumerate(outs):
        if i:  # the engine's gap since the previous step (binary fraction: exact sums)
            out.metrics.inter_token_latencies = [ITL]
        metrics.observe(out, i == 0)


@pytest.fixture
def metrics() -> ServerMetrics:
    # The engine's own count of computed prompt tokens must not be what vllm:prompt_tokens says.
    return ServerMetrics("m", stats=lambda: {"num_prompt_tokens": 153,
                                             "num_generated_tokens": 7})


def test_prompt_tokens_count_whole_prompts_prefix_cache_hits_included(metrics):
    """The audit's case: three identical 136-token prompts, the second and third served 128
    tokens from the prefix cache. vLLM counts 408 prompt tokens, 152 computed and 256 cached."""
    for num_cached in (0, 128, 128):
        serve(metrics, [make_out(136, 1, num_cached=num_cached),
                        make_out(136, 2, num_cached=num_cached, reason="length")])
    s = scrape(metrics)
    assert s["vllm:prompt_tokens_total{}"] == 408
    assert s["vllm:prompt_tokens_by_source_total{source=local_compute}"] == 152
    assert s["vllm:prompt_tokens_by_source_total{source=local_cache_hit}"] == 256
    assert s["vllm:prompt_tokens_by_source_total{source=external_kv_transfer}"] == 0
    assert s["vllm:prompt_tokens_cached_total{}"] == 256
    assert s["vllm:generation_tokens_total{}"] == 7  # still the engine's count


def test_per_request_histograms_are_observed_once_at_the_finish(metrics):
    serve(metrics, [make_out(10, 1), make_out(10, 3)])
    s = scrape(metrics)
    assert s["vllm:request_prompt_tokens_count{}"] == 0
    assert s["vllm:request_queue_time_seconds_count{}"] == 0
    assert s["vllm:inter_token_latency_seconds_count{}"] == 1
    last = make_out(10, 4, reason="stop")
    last.metrics.inter_token_latencies = [ITL, ITL]  # two steps held back, handed over at once
    metrics.observe(last, False)
    s = scrape(metrics)
    assert s["vllm:request_success_total{finished_reason=stop}"] == 1
    assert s["vllm:request_prompt_tokens_sum{}"] == 10
    assert s["vllm:request_generation_tokens_sum{}"] == 4
    assert s["vllm:request_generation_tokens_count{}"] == 1
    assert s["vllm:e2e_request_latency_seconds_sum{}"] == FINISHED - ARRIVAL
    assert s["vllm:request_queue_time_seconds_sum{}"] == SCHEDULED - ARRIVAL
    assert s["vllm:request_prefill_time_seconds_sum{}"] == FIRST_TOKEN - SCHEDULED
    assert s["vllm:request_decode_time_seconds_sum{}"] == FINISHED - FIRST_TOKEN
    assert s["vllm:request_inference_time_seconds_sum{}"] == FINISHED - SCHEDULED
    assert s["vllm:request_time_per_output_token_seconds_sum{}"] == (FINISHED - FIRST_TOKEN) / 3
    assert s["vllm:time_to_first_token_seconds_count{}"] == 1
    assert s["vllm:inter_token_latency_seconds_count{}"] == 3  # one per engine step
    assert s["vllm:inter_token_latency_seconds_sum{}"] == 3 * ITL
    assert s["vllm:prompt_tokens_total{}"] == 10  # once per request, not per output


def test_decode_ends_at_the_step_of_the_last_token(llm):
    # finished_time is stamped while the step's outputs are made, after the step's own time
    # (what its tokens carry): a one-token request had a decode time, vLLM's is 0.
    metrics = ServerMetrics("m", stats=dict)
    outs = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=1))
    m = outs[0].metrics
    assert m.last_token_time == m.first_token_time and m.finished_time > m.last_token_time
    metrics.observe(outs[0], True)
    s = scrape(metrics)
    assert s["vllm:request_decode_time_seconds_count{}"] == 1
    assert s["vllm:request_decode_time_seconds_sum{}"] == 0.0
    assert s["vllm:request_inference_time_seconds_sum{}"] == m.last_token_time - m.scheduled_time


def test_token_buckets_follow_max_model_len():
    assert buckets_1_2_5(1000) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000]
    s = scrape(ServerMetrics("m", stats=dict, max_model_len=2048))
    assert "vllm:request_prompt_tokens_bucket{le=2000.0}" in s
    assert "vllm:request_prompt_tokens_bucket{le=5000.0}" not in s


def test_finish_reasons_exist_at_zero_and_no_created_series(metrics):
    s = scrape(metrics)
    for reason in ("stop", "length", "abort"):
        assert s[f"vllm:request_success_total{{finished_reason={reason}}}"] == 0
    assert not [name for name in s if "_created" in name]


def test_abort_after_some_output(metrics):
    arrival = time.perf_counter() - 2.0
    serve(metrics, [make_out(10, 1, arrival=arrival), make_out(10, 3, arrival=arrival)])
    metrics.observe_abort(make_out(10, 3, arrival=arrival))
    s = scrape(metrics)
    assert s["vllm:request_success_total{finished_reason=abort}"] == 1
    assert s["vllm:e2e_request_latency_seconds_count{}"] == 1
    assert 2.0 <= s["vllm:e2e_request_latency_seconds_sum{}"] < 60.0
    assert s["vllm:request_generation_tokens_sum{}"] == 3
    assert s["vllm:request_prompt_tokens_sum{}"] == 10
    assert s["vllm:request_queue_time_seconds_count{}"] == 1
    # Without the time of its last token there is no decode or inference time to observe;
    # its prefill ended at its first token, which it had.
    assert s["vllm:request_decode_time_seconds_count{}"] == 0
    assert s["vllm:request_inference_time_seconds_count{}"] == 0
    assert s["vllm:request_prefill_time_seconds_count{}"] == 1
    assert s["vllm:request_prefill_time_seconds_sum{}"] == FIRST_TOKEN - SCHEDULED


def test_every_bucket_bound_of_vllm_is_exported(metrics):
    # A query or SLO written for vLLM names its bounds (le="0.04", le="0.2"): each must exist.
    vllm = {"vllm:time_to_first_token_seconds": (
                0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
            "vllm:inter_token_latency_seconds": (
                0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0),
            "vllm:request_queue_time_seconds": (
                0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)}
    s = scrape(metrics)
    for name, bounds in vllm.items():
        for b in bounds:
            assert f"{name}_bucket{{le={float(b)}}}" in s, (name, b)


def test_abort_before_any_output(metrics):
    metrics.observe_abort(None, arrival_time=time.perf_counter() - 1.0)
    metrics.observe_abort(None)  # nothing known but that it ended
    s = scrape(metrics)
    assert s["vllm:request_success_total{finished_reason=abort}"] == 2
    assert s["vllm:e2e_request_latency_seconds_count{}"] == 1
    assert s["vllm:e2e_request_latency_seconds_sum{}"] >= 1.0
    assert s["vllm:request_prompt_tokens_count{}"] == 0
    assert s["vllm:prompt_tokens_total{}"] == 0  # counted when a prefill is done, as vLLM does


def test_abort_of_a_finished_request_is_not_counted_twice(metrics):
    finished = make_out(10, 2, reason="stop")
    serve(metrics, [finished])
    metrics.observe_abort(finished)
    s = scrape(metrics)
    assert s["vllm:request_success_total{finished_reason=stop}"] == 1
    assert s["vllm:request_success_total{finished_reason=abort}"] == 0
    assert s["vllm:e2e_request_latency_seconds_count{}"] == 1


def test_request_params(metrics):
    metrics.observe_params(n=3, max_tokens=64)
    metrics.observe_params(n=1, max_tokens=100)
    s = scrape(metrics)
    assert s["vllm:request_params_n_count{}"] == 2
    assert s["vllm:request_params_n_sum{}"] == 4
    assert s["vllm:request_params_max_tokens_count{}"] == 4  # once per choice
    assert s["vllm:request_params_max_tokens_sum{}"] == 292


def test_iteration_tokens_from_the_engine_s_step_counts(llm):
    """Tokens per step, from the engine's own counts (a 9-token prefill, then 3 one-token
    decodes): scheduled (specserve's histogram) and vLLM's iteration_tokens_total, which
    counts a prompt whole in the step that finished its prefill, cached tokens included."""
    before = dict(llm.get_stats())
    llm.generate([list(range(100, 109))], SamplingParams(temperature=0, max_tokens=4,
                                                         ignore_eos=True))
    stats = llm.get_stats()

    def moved(key):
        return [a - b for a, b in zip(stats[key], before[key], strict=True)]

    assert moved("step_token_counts")[0] == 3 and moved("step_token_counts")[2] == 1
    assert moved("iteration_token_counts")[0] == 3 and moved("iteration_token_counts")[2] == 1
    # A prompt served again from the prefix cache but for its last 4 tokens (two 16-token
    # blocks cached): 4 tokens scheduled, 36 + 1 in vLLM's count.
    prompt = list(range(200, 236))
    llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1))
    before = dict(llm.get_stats())
    llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1))
    stats = llm.get_stats()
    assert stats["num_step_tokens"] - before["num_step_tokens"] == 4
    assert stats["num_iteration_tokens"] - before["num_iteration_tokens"] == 37
    s = scrape(ServerMetrics("m", stats=lambda: stats))
    assert s["vllm:iteration_tokens_total_count{}"] == sum(stats["iteration_token_counts"])
    assert s["vllm:iteration_tokens_total_sum{}"] == stats["num_iteration_tokens"]
    assert s["vllm:iteration_tokens_total_bucket{le=1.0}"] == stats["iteration_token_counts"][0]
    assert s["specserve:step_scheduled_tokens_sum{}"] == stats["num_step_tokens"]


def test_cache_config_info():
    stats = {"kv_blocks_total": 512}
    s = scrape(ServerMetrics("m", stats=lambda: stats, cache_config=CacheConfig(block_size=32)))
    info = [(k, v) for k, v in s.items() if k.startswith("vllm:cache_config_info")]
    assert len(info) == 1 and info[0][1] == 1
    for label in ("block_size=32", "num_gpu_blocks=512", "enable_prefix_caching=True",
                  "cache_dtype=auto"):
        assert label in info[0][0]
    assert not [k for k in scrape(ServerMetrics("m", stats=dict)) if "cache_config" in k]


def test_engine_records_when_a_request_was_first_scheduled():
    """The queue and prefill times need it; a preempted request's re-admission keeps it."""
    sched = Scheduler(SchedulerConfig(), BlockManager(16, 4, True))
    req = Request("a", list(range(8)), SamplingParams(max_tokens=4))
    sched.add_request(req)
    assert req.scheduled_time is None
    sched.schedule()
    first = req.scheduled_time
    assert first is not None and first >= req.arrival_time
    sched._preempt(req)
    sched.schedule()
    assert req.scheduled_time == first
    out = make_output(req, tokenizer=None, num_new=0)
    assert out.metrics.scheduled_time == first


def test_speculation_metrics_from_a_real_engine():
    """vLLM's spec-decode counters (drafts, accepted tokens per position) and the chosen-K
    histogram, from an n-gram engine that copied a record: per-position counts add up to the
    accepted tokens and never rise with the position; the K buckets hold every choice."""
    from specserve import LLM

    spec = LLM(dtype="float32", speculation_policy="static", kv_cache_memory=64 << 20,
               speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    prompt = 'Copy: {"id": 7, "name": "lamp", "tags": ["a", "b"]}\n{"id": 7, "name": "lamp",'
    spec.generate([prompt] * 2, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    stats = spec.get_stats()
    s = scrape(ServerMetrics("m", stats=lambda: stats))
    assert s["vllm:spec_decode_num_drafts_total{}"] == stats["num_verifications"] > 0
    per_pos = [s[f"vllm:spec_decode_num_accepted_tokens_per_pos_total{{position={j}}}"]
               for j in range(len(stats["accepted_per_position"]))]
    assert per_pos and sum(per_pos) == stats["num_accepted_tokens"] > 0
    assert per_pos == sorted(per_pos, reverse=True) and per_pos[0] <= stats["num_verifications"]
    hist = stats["spec_k_histogram"]
    assert s["specserve:spec_decode_chosen_k_count{}"] == sum(hist.values())
    assert s["specserve:spec_decode_chosen_k_bucket{le=3.0}"] == sum(hist.values())
    assert s["specserve:spec_decode_chosen_k_bucket{le=0.0}"] == hist.get(0, 0)
    assert s["specserve:spec_decode_chosen_k_sum{}"] == sum(k * n for k, n in hist.items())


def test_a_front_end_arrival_time_starts_the_requests_clock(llm):
    """The server stamps a request when it arrives, before grammar compilation and the wait for
    the engine thread's current step; the engine keeps that earlier time for TTFT, queue time
    and e2e (a later one, say a skewed clock, never moves it forward)."""
    earlier = time.perf_counter() - 5.0
    req = llm.engine.add_request([100, 101, 102], SamplingParams(max_tokens=2),
                                 arrival_time=earlier)
    assert req.arrival_time == earlier
    later = llm.engine.add_request([100, 101, 102], SamplingParams(max_tokens=2),
                                   arrival_time=time.perf_counter() + 60)
    assert later.arrival_time <= time.perf_counter()
    outs = {}
    while llm.engine.has_unfinished_requests():
        outs.update({o.request_id: o for o in llm.engine.step() if o.finished})
    assert outs[req.request_id].metrics.ttft >= 5.0
