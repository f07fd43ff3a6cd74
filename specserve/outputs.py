"""What the engine returns, in vLLM's shape."""

from __future__ import annotations

from dataclasses import dataclass, field


class Logprob(float):
    """One token's log-probability: a float, so that code reading numbers keeps working, with
    vLLM's fields (`.logprob`, `.rank`: 1 for the likeliest token, `.decoded_token`: the
    token's text decoded alone)."""

    __slots__ = ("rank", "decoded_token")

    def __new__(cls, logprob: float, rank: int | None = None,
                decoded_token: str | None = None) -> Logprob:
        obj = super().__new__(cls, logprob)
        obj.rank = rank
        obj.decoded_token = decoded_token
        return obj

    @property
    def logprob(self) -> float:
        return float(self)

    def __repr__(self) -> str:
        return (f"Logprob(logprob={float(self)!r}, rank={self.rank!r}, "
                f"decoded_token={self.decoded_token!r})")

    __str__ = float.__repr__  # printed and formatted as the number it is


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    # Per output token, {token id: Logprob}: the sampled token's and the top `logprobs` ones.
    logprobs: list[dict[int, Logprob]] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestMetrics:
    arrival_time: float
    first_token_time: float | None
    finished_time: float | None
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # When the scheduler first admitted the request (queue time ends, prefill starts).
    scheduled_time: float | None = None
    # Seconds from the previous step that emitted tokens for this request to the step that made
    # this output (none for the first token), on the engine's clock: vLLM's inter-token
    # latency, one per step (a step that verified drafts may emit several tokens). A server
    # that holds outputs back (--stream-interval) hands over the gaps of every step it held.
    inter_token_latencies: list[float] = field(default_factory=list)
    # The step time the latest token carries (vLLM's last_token_ts): a request's decode and
    # inference end here, not when the step's output loop reached it (finished_time).
    last_token_time: float | None = None

    @property
    def ttft(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    # Text and tokens added since the previous output of this request (streaming).
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    # With SamplingParams.prompt_logprobs: per prompt token, its Logprob and the top ones given
    # the tokens before it (None for the first token, which nothing precedes), as vLLM's.
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
