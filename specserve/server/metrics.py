"""Prometheus metrics under vLLM's names, so that existing dashboards work unchanged.

Two sources: per-request latencies, observed on the event loop as outputs are delivered
(histograms), and the engine's cumulative counters and gauges, read from its latest stats
snapshot at scrape time (a custom collector, so the engine keeps the only copy of each count).
A registry of our own keeps the process-wide default one (and its other users) out of /metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from specserve.outputs import RequestOutput

CONTENT_TYPE = CONTENT_TYPE_LATEST

_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_ITL_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.04, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)
_E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)

# (metric name, engine stats key, help). Keys the engine does not report yet export as 0.
_COUNTERS = (
    ("vllm:prompt_tokens", "num_prompt_tokens", "Prompt tokens computed (prefix-cache hits "
                                                "excluded)."),
    ("vllm:generation_tokens", "num_generated_tokens", "Generated tokens."),
    ("vllm:prefix_cache_queries", "prefix_cache_queries", "Prompt tokens looked up in the "
                                                          "prefix cache."),
    ("vllm:prefix_cache_hits", "prefix_cache_hits", "Prompt tokens found in the prefix cache."),
    ("vllm:num_preemptions", "num_preemptions", "Requests preempted for lack of KV blocks."),
    ("vllm:spec_decode_num_draft_tokens", "num_draft_tokens", "Draft tokens proposed."),
    ("vllm:spec_decode_num_accepted_tokens", "num_accepted_tokens", "Draft tokens accepted."),
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
    # vLLM has no equivalent: the adaptive controller's mean speculation length.
    ("specserve:spec_decode_k_mean", "spec_k_mean", "Mean number of speculative tokens chosen."),
)


class _EngineStatsCollector(Collector):
    def __init__(self, stats: Callable[[], dict], model_name: str):
        self._stats = stats
        self._labels = {"model_name": model_name}

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


class ServerMetrics:
    def __init__(self, model_name: str, stats: Callable[[], dict]):
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        self._model_name = model_name
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token.",
                              labels, buckets=_TTFT_BUCKETS, registry=self.registry)
        self.itl = Histogram("vllm:inter_token_latency_seconds",
                             "Time between consecutive outputs of a request (one step; with "
                             "speculation one output may carry several tokens).",
                             labels, buckets=_ITL_BUCKETS, registry=self.registry)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds",
                             "Arrival to last token, for finished requests.",
                             labels, buckets=_E2E_BUCKETS, registry=self.registry)
        self.success = Counter("vllm:request_success", "Finished requests, by finish reason.",
                               labels + ["finished_reason"], registry=self.registry)
        self.registry.register(_EngineStatsCollector(stats, model_name))
        # Bound once: a labels() lookup per token is measurable at a thousand tokens a second.
        self._ttft, self._itl, self._e2e = (h.labels(model_name)
                                            for h in (self.ttft, self.itl, self.e2e))

    def observe(self, out: RequestOutput, since_previous: float | None) -> None:
        """Called on the event loop for every delivered output."""
        m = out.metrics
        if since_previous is None:
            if m is not None and m.ttft is not None:
                self._ttft.observe(m.ttft)
        else:
            self._itl.observe(since_previous)
        if out.finished:
            reason = out.outputs[0].finish_reason or "unknown"
            self.success.labels(self._model_name, reason).inc()
            if m is not None and m.finished_time is not None:
                self._e2e.observe(m.finished_time - m.arrival_time)

    def render(self) -> bytes:
        return generate_latest(self.registry)
