"""Prometheus metrics under vLLM's names, so that existing dashboards work unchanged.

Two sources: per-request numbers, observed on the event loop as outputs are delivered (histograms,
and the prompt-token counters, which vLLM also counts per request), and the engine's cumulative
counters and gauges, read from its latest stats snapshot at scrape time (a custom collector, so
the engine keeps the only copy of each count). A registry of our own keeps the process-wide
default one (and its other users) out of /metrics.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from specserve.config import CacheConfig
from specserve.engine.llm_engine import STEP_TOKEN_BUCKETS
from specserve.outputs import RequestOutput

CONTENT_TYPE = CONTENT_TYPE_LATEST

# vLLM's bounds, every one (a query or SLO copied from a vLLM setup names them: le="0.04"),
# with finer ones beside them for a fast GPU and the long tails of a loaded CPU.
_VLLM_TTFT = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
              7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_VLLM_ITL = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
             10.0, 20.0, 40.0, 80.0)
_VLLM_PHASE = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
_TTFT_BUCKETS = tuple(sorted({*_VLLM_TTFT, 0.0025, 0.025, 0.05}))
_ITL_BUCKETS = tuple(sorted({*_VLLM_ITL, 0.001, 0.002, 0.005, 0.02, 0.04}))
# A request's end-to-end time and its phases (queue, prefill, decode, inference): vLLM's start
# at 0.3 s, where a GPU's queue and prefill times all fall in the first bucket.
_PHASE_BUCKETS = tuple(sorted({*_VLLM_PHASE, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2}))
_N_BUCKETS = (1, 2, 5, 10, 20)
# Created at zero, as vLLM does, so that a dashboard sees every reason before it first happens.
FINISH_REASONS = ("stop", "length", "abort")

# (metric name, engine stats key, help). Keys the engine does not report yet export as 0.
_COUNTERS = (
    ("vllm:generation_tokens", "num_generated_tokens", "Generated tokens."),
    ("vllm:prefix_cache_queries", "prefix_cache_queries", "Prompt tokens looked up in the "
                                                          "prefix cache."),
    ("vllm:prefix_cache_hits", "prefix_cache_hits", "Prompt tokens found in the prefix cache."),
    ("vllm:num_preemptions", "num_preemptions", "Requests preempted for lack of KV blocks."),
    ("vllm:spec_decode_num_draft_tokens", "num_draft_tokens", "Draft tokens proposed."),
    ("vllm:spec_decode_num_accepted_tokens", "num_accepted_tokens", "Draft tokens accepted."),
    # vLLM's: drafts verified, one per request per step; mean acceptance length is
    # 1 + accepted / drafts.
    ("vllm:spec_decode_num_drafts", "num_verifications", "Drafts verified."),
    # vLLM has no equivalent: structured-output tokens forced by the grammar, drafted apart.
    ("specserve:jump_forward_draft_tokens", "num_jump_forward_tokens",
     "Grammar-forced tokens verified as drafts."),
    ("specserve:jump_forward_accepted_tokens", "num_jump_forward_accepted",
     "Grammar-forced draft tokens accepted."),
)
_GAUGES = (
    ("vllm:num_requests_running", "num_running", "Requests in the running batch."),
    ("vllm:num_requests_waiting", "num_waiting", "Requests waiting to be scheduled."),
    ("vllm:kv_cache_usage_perc", "kv_cache_usage", "Fraction of KV-cache blocks in use (0-1)."),
    # vLLM has no equivalent: the adaptive controller's recent speculation length.
    ("specserve:spec_decode_k_mean", "spec_k_mean",
     "Mean number of speculative tokens drafted per request per step, over about the last "
     "100 steps."),
)


def buckets_1_2_5(limit: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to limit: vLLM's buckets for token counts."""
    buckets, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > limit:
                return buckets
            buckets.append(mantissa * scale)
        scale *= 10


class _EngineStatsCollector(Collector):
    def __init__(self, stats: Callable[[], dict], model_name: str,
                 cache_config: CacheConfig | None):
        self._stats = stats
        self._labels = {"model_name": model_name}
        self._cache_config = cache_config

    def collect(self) -> Iterable[Metric]:
        stats = self._stats()
        for name, key, doc in _COUNTERS:
            family = CounterMetricFamily(name, doc, labels=list(self._labels))
            family.add_metric(list(self._labels.values()), float(stats.get(key) or 0))
            yield family
        for name, key, doc in _GAUGES:
            family = GaugeMetricFamily(name, doc, labels=list(self._labels))
            family.add_metric(list(self._labels.values()), float(stats.get(key) or 0))
            yield family
        if stats.get("spec_method"):
            # Every position up to K_max from the start, at 0 until one is accepted (vLLM's).
            counts = list(stats.get("accepted_per_position") or [])
            counts += [0] * (stats.get("spec_k_max", 0) - len(counts))
            yield _accepted_per_position(counts, self._labels)
        if stats.get("spec_policy") is not None:
            yield _chosen_k(stats.get("spec_k_histogram") or {}, stats["spec_k_max"],
                            self._labels)
        if stats.get("step_token_counts"):
            yield _token_histogram("vllm:iteration_tokens_total",
                                   "Tokens per engine step: the prompts whose prefill it "
                                   "finished plus the tokens it emitted (vLLM's).",
                                   stats["iteration_token_counts"],
                                   stats["num_iteration_tokens"], self._labels)
            yield _token_histogram("specserve:step_scheduled_tokens",
                                   "Tokens scheduled per engine step: prefill chunks, decode "
                                   "tokens and the drafts verified (rejected ones included).",
                                   stats["step_token_counts"], stats["num_step_tokens"],
                                   self._labels)
        if self._cache_config is not None:
            yield _cache_config_info(self._cache_config, stats.get("kv_blocks_total"))


def _token_histogram(name: str, help_text: str, counts: list[int], total: int,
                     labels: dict[str, str]) -> Metric:
    """A tokens-per-step histogram from the engine's own bucket counts (STEP_TOKEN_BUCKETS and
    one slot past the last bound)."""
    family = HistogramMetricFamily(name, help_text, labels=list(labels))
    bounds = [floatToGoString(b) for b in STEP_TOKEN_BUCKETS] + ["+Inf"]  # "1.0", as others
    family.add_metric(list(labels.values()), list(zip(bounds, itertools.accumulate(counts),
                                                      strict=True)), sum_value=total)
    return family


def _accepted_per_position(counts: list[int], labels: dict[str, str]) -> Metric:
    """vLLM's per-position acceptance counter: accepted draft tokens at each position of their
    draft; over vllm:spec_decode_num_drafts, the acceptance rate of each position."""
    family = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                 "Accepted draft tokens by position in the draft.",
                                 labels=[*labels, "position"])
    for position, count in enumerate(counts):
        family.add_metric([*labels.values(), str(position)], float(count))
    return family


def _chosen_k(histogram: dict[int, int], k_max: int, labels: dict[str, str]) -> Metric:
    """The speculation length per (request, step) under the policy's choice, what was drafted
    (a static K where n-gram found no match is 0), as a histogram with one bucket per K in
    0..k_max (counts since the policy was set)."""
    family = HistogramMetricFamily("specserve:spec_decode_chosen_k",
                                   "Speculative tokens drafted per request per step.",
                                   labels=list(labels))
    counts = itertools.accumulate(histogram.get(k, 0) for k in range(k_max + 1))
    buckets = [(floatToGoString(k), c) for k, c in enumerate(counts)]
    buckets.append(("+Inf", sum(histogram.values())))
    family.add_metric(list(labels.values()), buckets,
                      sum_value=float(sum(k * n for k, n in histogram.items())))
    return family


def _cache_config_info(cache: CacheConfig, num_blocks: int | None) -> Metric:
    """vLLM's info-style gauge: always 1, the configuration in its labels (vLLM's label names
    where the meaning is the same; num_gpu_blocks is the KV pool's size on any device)."""
    labels = {"block_size": str(cache.block_size), "cache_dtype": cache.kv_cache_dtype,
              "enable_prefix_caching": str(cache.enable_prefix_caching),
              "num_gpu_blocks": str(num_blocks), "kv_cache_memory": str(cache.kv_cache_memory)}
    family = GaugeMetricFamily("vllm:cache_config_info", "Information of the engine's cache "
                               "config.", labels=list(labels))
    family.add_metric(list(labels.values()), 1.0)
    return family


class ServerMetrics:
    """The server's /metrics. max_model_len bounds the token-count buckets; cache_config, when
    given, is exported as vllm:cache_config_info."""

    def __init__(self, model_name: str, stats: Callable[[], dict], *,
                 max_model_len: int | None = None, cache_config: CacheConfig | None = None):
        # vLLM turns the *_created series off: they double the series count and no dashboard
        # reads them. The switch is process-wide in prometheus_client.
        disable_created_metrics()
        self.registry = registry = CollectorRegistry()
        self._model_name = model_name

        # Each bound to its label once: a labels() lookup per token is measurable at a
        # thousand tokens a second.
        def histogram(name: str, doc: str, buckets) -> Histogram:
            family = Histogram(name, doc, ["model_name"], buckets=buckets, registry=registry)
            return family.labels(model_name)

        def counter(name: str, doc: str, label: str | None = None) -> Counter:
            return Counter(name, doc, ["model_name"] + ([label] if label else []),
                           registry=registry)

        token_buckets = buckets_1_2_5(max_model_len or 100_000)  # unknown: a long context's
        self._ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token.",
                               _TTFT_BUCKETS)
        self._itl = histogram("vllm:inter_token_latency_seconds",
                              "Time between consecutive engine steps that emitted tokens for a "
                              "request (with speculation one step may emit several tokens).",
                              _ITL_BUCKETS)
        self._e2e = histogram("vllm:e2e_request_latency_seconds",
                              "Arrival to last token (to the abort, for aborted requests).",
                              _PHASE_BUCKETS)
        # Per request, what speculation shortens (ITL above is per step, and one step may
        # emit several tokens).
        self._tpot = histogram("vllm:request_time_per_output_token_seconds",
                               "Decode time over the tokens after the first, per finished "
                               "request.", _ITL_BUCKETS)
        self._queue = histogram("vllm:request_queue_time_seconds",
                                "Arrival to first scheduled.", _PHASE_BUCKETS)
        self._prefill = histogram("vllm:request_prefill_time_seconds",
                                  "First scheduled to first token (preemptions included).",
                                  _PHASE_BUCKETS)
        self._decode = histogram("vllm:request_decode_time_seconds",
                                 "First token to last token.", _PHASE_BUCKETS)
        self._inference = histogram("vllm:request_inference_time_seconds",
                                    "First scheduled to last token.", _PHASE_BUCKETS)
        self._prompt_len = histogram("vllm:request_prompt_tokens",
                                     "Prompt tokens of each finished request.", token_buckets)
        self._generation_len = histogram("vllm:request_generation_tokens",
                                         "Generated tokens of each finished request.",
                                         token_buckets)
        self._n = histogram("vllm:request_params_n", "The n request parameter.", _N_BUCKETS)
        self._max_tokens = histogram("vllm:request_params_max_tokens",
                                     "The max_tokens request parameter.", token_buckets)
        # vLLM counts a request's whole prompt once, when its prefill is done, and splits it by
        # where its KV came from: computed here, or served by the prefix cache.
        self._prompt = counter("vllm:prompt_tokens", "Prompt tokens of requests whose prefill "
                               "is done (prefix-cache hits included).").labels(model_name)
        self._cached = counter("vllm:prompt_tokens_cached",
                               "Prompt tokens served by the prefix cache.").labels(model_name)
        by_source = counter("vllm:prompt_tokens_by_source", "Prompt tokens by source: "
                            "local_compute (prefilled) or local_cache_hit (prefix cache).",
                            "source")
        self._computed = by_source.labels(model_name, "local_compute")
        self._cache_hit = by_source.labels(model_name, "local_cache_hit")
        by_source.labels(model_name, "external_kv_transfer")  # vLLM's third source: none here
        self.success = counter("vllm:request_success", "Finished requests, by finish reason.",
                               "finished_reason")
        self._success = {r: self.success.labels(model_name, r) for r in FINISH_REASONS}
        registry.register(_EngineStatsCollector(stats, model_name, cache_config))

    def observe(self, out: RequestOutput, first: bool) -> None:
        """Called on the event loop for every delivered output (first: the request's first).
        Inter-token latencies are the engine's step-to-step gaps that the output carries, as
        vLLM times them, not gaps between deliveries: those add the hand-off to this thread
        and span several steps with --stream-interval. Per-request work happens only at the
        first and the finishing output."""
        if first:
            self._on_first_output(out)
        if out.metrics is not None:
            for itl in out.metrics.inter_token_latencies:
                self._itl.observe(itl)
        if out.finished:
            m = out.metrics
            self._on_end(out, out.outputs[0].finish_reason or "unknown",
                         m.finished_time if m is not None else None, None)

    def observe_abort(self, last: RequestOutput | None, arrival_time: float | None = None
                      ) -> None:
        """An engine request that ended unfinished: its client went away, or the server shut
        down. last: its last delivered output, None if it got none; arrival_time: when it was
        submitted (time.perf_counter(), the engine's clock), used when last is None. Counted as
        finished_reason="abort" with its e2e latency up to now; the token histograms only when
        last is known. A finished last output was counted by observe(): nothing is done."""
        if last is not None and last.finished:
            return
        self._on_end(last, "abort", time.perf_counter(), arrival_time)

    def observe_params(self, n: int, max_tokens: int) -> None:
        """An admitted API request's sampling parameters, once per prompt: n once and
        max_tokens (the one in effect) once per choice, as vLLM observes them."""
        self._n.observe(n)
        for _ in range(n):
            self._max_tokens.observe(max_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def _on_first_output(self, out: RequestOutput) -> None:
        m = out.metrics
        if m is not None and m.ttft is not None:
            self._ttft.observe(m.ttft)
        num_cached = m.num_cached_tokens if m is not None else 0
        self._prompt.inc(len(out.prompt_token_ids))
        self._computed.inc(len(out.prompt_token_ids) - num_cached)
        self._cache_hit.inc(num_cached)
        self._cached.inc(num_cached)

    def _on_end(self, out: RequestOutput | None, reason: str, end_time: float | None,
                arrival_time: float | None) -> None:
        """A request's end, finished (end_time: its last token) or aborted (end_time: now)."""
        (self._success.get(reason) or self.success.labels(self._model_name, reason)).inc()
        m = out.metrics if out is not None else None
        if m is not None:
            arrival_time = m.arrival_time
        if arrival_time is not None and end_time is not None:
            self._e2e.observe(end_time - arrival_time)
        if out is None:
            return
        self._prompt_len.observe(len(out.prompt_token_ids))
        self._generation_len.observe(len(out.outputs[0].token_ids))
        if m is None or m.scheduled_time is None:
            return
        self._queue.observe(m.scheduled_time - m.arrival_time)
        if m.first_token_time is None:
            return
        self._prefill.observe(m.first_token_time - m.scheduled_time)
        # The phases after it end at the last token (the step time it carries, as vLLM's);
        # an aborted request's output has no finish, and they are not observed.
        if m.finished_time is None:
            return
        last = m.last_token_time if m.last_token_time is not None else m.finished_time
        self._decode.observe(last - m.first_token_time)
        if len(out.outputs[0].token_ids) > 1:
            self._tpot.observe((last - m.first_token_time) / (len(out.outputs[0].token_ids) - 1))
        self._inference.observe(last - m.scheduled_time)
