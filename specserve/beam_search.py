"""Beam search over the engine, as vLLM V1 runs it: each step scores every live beam as a
one-token request (its top 2 x beam_width logprobs, temperature 0), the candidates of all beams
compete, and the beam_width best continue. A beam that ends in an end-of-sequence token is set
aside as finished. The prefix cache keeps each step to the beams' new tokens (and their last
partial block), so no beam state lives in the engine.

The result is the beam_width best of the finished and the live beams, ranked by
cum_logprob / length ** length_penalty, where length counts the generated tokens without a final
end-of-sequence token (Hugging Face's normalisation; vLLM's also counts the prompt).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from specserve.engine.detokenizer import decode_after
from specserve.outputs import CompletionOutput, Logprob, RequestOutput
from specserve.sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class BeamSearchParams:
    """vLLM's BeamSearchParams. temperature must be 0: beams are ranked by the model's own
    log-probabilities."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def validate(self) -> None:
        def is_int(x) -> bool:
            return isinstance(x, int) and not isinstance(x, bool)

        if not is_int(self.beam_width) or not 1 <= self.beam_width <= MAX_BEAM_WIDTH:
            raise ValueError(f"beam_width must be in 1..{MAX_BEAM_WIDTH} (each step asks for "
                             f"2 x beam_width logprobs, at most 20), got {self.beam_width!r}")
        if not is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        if self.temperature != 0:
            raise ValueError("beam search ranks beams by the model's own log-probabilities: "
                             f"temperature must be 0, got {self.temperature!r}")
        if isinstance(self.length_penalty, bool) or not isinstance(
                self.length_penalty, (int, float)) or not math.isfinite(self.length_penalty):
            raise ValueError(f"length_penalty must be a finite number, got "
                             f"{self.length_penalty!r}")


MAX_BEAM_WIDTH = 10  # 2 x 10 candidates per beam: SamplingParams' logprobs limit


@dataclass(slots=True)
class BeamSearchSequence:
    """One beam: tokens holds the prompt and the generated tokens (as vLLM's); text is the
    generated tokens' text (vLLM's holds the prompt's too); logprobs, one entry per generated
    token, the chosen token's Logprob."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: str | None = None
    finish_reason: str | None = None  # "stop" (an end-of-sequence token) or "length"
    num_prompt_tokens: int = 0

    @property
    def output_token_ids(self) -> list[int]:
        return self.tokens[self.num_prompt_tokens:]


@dataclass(slots=True)
class BeamSearchOutput:
    """A prompt's beam_width best sequences, best first."""

    sequences: list[BeamSearchSequence]


def beam_score(beam: BeamSearchSequence, eos_token_ids: Sequence[int],
               length_penalty: float) -> float:
    out = beam.output_token_ids
    length = len(out) - (1 if out and out[-1] in eos_token_ids else 0)
    return beam.cum_logprob / max(length, 1) ** length_penalty


class BeamSearch:
    """The search for one prompt, driven from outside: `pending()` gives the token ids to score
    next, `advance()` takes each one's top logprobs; `done` once no beam is live."""

    def __init__(self, prompt_ids: list[int], params: BeamSearchParams,
                 eos_token_ids: Sequence[int]):
        self.params = params
        self.eos = () if params.ignore_eos else tuple(eos_token_ids)
        self.beams = [BeamSearchSequence(list(prompt_ids), num_prompt_tokens=len(prompt_ids))]
        self.finished: list[BeamSearchSequence] = []
        self.steps = 0

    @property
    def done(self) -> bool:
        return not self.beams

    def pending(self) -> list[list[int]]:
        return [b.tokens for b in self.beams]

    def step_params(self) -> SamplingParams:
        """What each beam's one-token request asks for: the top 2 x beam_width tokens (enough
        for beam_width live candidates even if up to beam_width of them end the sequence)."""
        return SamplingParams(temperature=0.0, max_tokens=1, logprobs=2 * self.params.beam_width,
                              ignore_eos=True, num_speculative_tokens=0)

    def advance(self, top: list[dict[int, Logprob]]) -> None:
        """top: per live beam (in pending's order), its candidates' logprobs."""
        candidates = []
        for beam, logprobs in zip(self.beams, top, strict=True):
            for token, logprob in logprobs.items():
                candidates.append(BeamSearchSequence(
                    beam.tokens + [token], beam.logprobs + [{token: logprob}],
                    beam.cum_logprob + float(logprob), num_prompt_tokens=beam.num_prompt_tokens))
        self.steps += 1
        live = []
        for c in candidates:
            if c.tokens[-1] in self.eos:
                c.finish_reason = "stop"
                self.finished.append(c)
            else:
                live.append(c)
        # Live beams all have the same length: their order is the cumulative logprob's.
        live.sort(key=lambda b: b.cum_logprob, reverse=True)
        self.beams = live[:self.params.beam_width]
        if self.steps >= self.params.max_tokens:
            for b in self.beams:
                b.finish_reason = "length"
            self.finished += self.beams
            self.beams = []

    def result(self, tokenizer) -> BeamSearchOutput:
        """The beam_width best sequences, their texts decoded (an end-of-sequence token's only
        with include_stop_str_in_output)."""
        ranked = sorted(self.finished, reverse=True,
                        key=lambda b: beam_score(b, self.eos, self.params.length_penalty))
        best = ranked[:self.params.beam_width]
        for b in best:
            out = b.output_token_ids
            if b.finish_reason == "stop" and not self.params.include_stop_str_in_output:
                out = out[:-1]
            b.text = decode_after(tokenizer, b.tokens[:b.num_prompt_tokens], out,
                                  skip=not self.params.include_stop_str_in_output)
        return BeamSearchOutput(best)

    def as_outputs(self, tokenizer, request_id: str) -> list[RequestOutput]:
        """The result as the server's choices: one finished RequestOutput per beam, best
        first (its token ids end with the end-of-sequence token, as a generated output's)."""
        return [RequestOutput(
            f"{request_id}-{j}", None, b.tokens[:b.num_prompt_tokens],
            [CompletionOutput(j, b.text, b.output_token_ids, b.cum_logprob,
                              finish_reason=b.finish_reason)], finished=True)
            for j, b in enumerate(self.result(tokenizer).sequences)]
