"""Beam search over the engine, as vLLM V1 runs it: each step scores every live beam as a
one-token request (its top 2 x beam_width logprobs, temperature 0), the candidates of all beams
compete, and the beam_width best continue. A beam that ends in an end-of-sequence token is set
aside as finished. The prefix cache keeps each step to the beams' new tokens (and their last
partial block), so no beam state lives in the engine.

The result is the beam_width best finished beams (those cut at max_tokens among them), ranked
by cum_logprob / length ** length_penalty, where length counts the generated tokens with a final
end-of-sequence token, as transformers counts them (vLLM's counts the prompt's and not the
end-of-sequence token). The search stops early only when no live beam can still enter them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
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
    skip_special_tokens: bool = True  # (not vLLM's: the texts' special tokens, as SamplingParams)

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
                self.length_penalty, (int, float)) or not _finite(self.length_penalty):
            raise ValueError(f"length_penalty must be a finite number, got "
                             f"{self.length_penalty!r}")


MAX_BEAM_WIDTH = 10  # 2 x 10 candidates per beam: SamplingParams' logprobs limit


def _finite(x: float) -> bool:
    try:
        return math.isfinite(x)
    except OverflowError:  # an int past a float's range
        return False


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


def rank_key(cum_logprob: float, length: int, length_penalty: float) -> float:
    """What the search ranks finished beams by, higher first: the order of cum_logprob /
    length ** length_penalty (transformers' score; length the generated tokens, a final
    end-of-sequence token included), taken in log space. The score itself leaves a float for a
    large |length_penalty| (16 ** 300 raises OverflowError, 16 ** -300 is 0 and the division
    fails); cum_logprob <= 0, so the score is -exp(-key)."""
    if cum_logprob >= 0:
        return math.inf
    return length_penalty * math.log(max(length, 1)) - math.log(-cum_logprob)


def beam_score(beam: BeamSearchSequence, length_penalty: float) -> float:
    """transformers' score, cum_logprob / length ** length_penalty (-inf past a float's range)."""
    key = rank_key(beam.cum_logprob, len(beam.output_token_ids), length_penalty)
    return -math.exp(-key) if -key < 709 else -math.inf


def advance_all(searches: list[BeamSearch], top: list[dict[int, Logprob]]) -> None:
    """Advance live searches from the top logprobs of all their beams, flat, in the order of
    their pending() lists joined."""
    scored = iter(top)
    for search in searches:
        search.advance([next(scored) for _ in search.beams])


class BeamSearch:
    """The search for one prompt, driven from outside: `pending()` gives the token ids to score
    next, `advance()` takes each one's top logprobs; `done` once no beam is live."""

    def __init__(self, prompt_ids: list[int], params: BeamSearchParams,
                 eos_token_ids: Sequence[int]):
        self.params = params
        self.eos = () if params.ignore_eos else tuple(eos_token_ids)
        self.beams = [BeamSearchSequence(list(prompt_ids), num_prompt_tokens=len(prompt_ids))]
        # The best beam_width finished beams so far, best first, with their scores: one that
        # falls out of them can never return (the set only grows), so no other is kept.
        self.finished: list[tuple[float, BeamSearchSequence]] = []
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
        """top: per live beam (in pending's order), its candidates' logprobs. Candidates are
        ranked as numbers first; only those kept become sequences."""
        width, penalty = self.params.beam_width, self.params.length_penalty
        self.steps += 1
        candidates = sorted(
            ((beam.cum_logprob + float(lp), i, token, lp)
             for i, (beam, lps) in enumerate(zip(self.beams, top, strict=True))
             for token, lp in lps.items()), key=lambda c: c[0], reverse=True)
        live = []
        for cum, i, token, lp in candidates:
            if token in self.eos:
                self._finish(rank_key(cum, self.steps, penalty), "stop",
                             lambda i=i, token=token, lp=lp, cum=cum: self._extend(i, token, lp,
                                                                                   cum))
            elif len(live) < width:
                live.append(self._extend(i, token, lp, cum))
        if self.steps >= self.params.max_tokens:
            for b in live:
                self._finish(rank_key(b.cum_logprob, self.steps, penalty), "length",
                             lambda b=b: b)
            live = []
        self.beams = live
        if live and len(self.finished) == width:
            # Logprobs are <= 0, so a live beam's cum_logprob only falls; its best possible
            # score is at the longest length for a positive penalty, else at the next one.
            length = self.params.max_tokens if penalty > 0 else self.steps + 1
            best = rank_key(max(b.cum_logprob for b in live), length, penalty)
            if best <= self.finished[-1][0]:
                self.beams = []  # none can enter the best beam_width any more

    def _extend(self, i: int, token: int, lp: Logprob, cum: float) -> BeamSearchSequence:
        beam = self.beams[i]
        return BeamSearchSequence(beam.tokens + [token], beam.logprobs + [{token: lp}], cum,
                                  num_prompt_tokens=beam.num_prompt_tokens)

    def _finish(self, score: float, reason: str,
                make: Callable[[], BeamSearchSequence]) -> None:
        """Keep a finished beam if it is among the best beam_width (made only then); score: its
        rank_key."""
        if len(self.finished) == self.params.beam_width and score <= self.finished[-1][0]:
            return
        beam = make()
        beam.finish_reason = reason
        self.finished.append((score, beam))
        self.finished.sort(key=lambda sb: sb[0], reverse=True)  # stable: earlier first on ties
        del self.finished[self.params.beam_width:]

    def result(self, tokenizer) -> BeamSearchOutput:
        """The beam_width best sequences, their texts decoded (an end-of-sequence token's only
        with include_stop_str_in_output)."""
        best = [b for _, b in self.finished]
        for b in best:
            out = b.output_token_ids
            if b.finish_reason == "stop" and not self.params.include_stop_str_in_output:
                out = out[:-1]
            b.text = decode_after(tokenizer, b.tokens[:b.num_prompt_tokens], out,
                                  skip=self.params.skip_special_tokens)
        return BeamSearchOutput(best)

    def as_outputs(self, tokenizer, request_id: str) -> list[RequestOutput]:
        """The result as the server's choices: one finished RequestOutput per beam, best
        first (its token ids end with the end-of-sequence token, as a generated output's)."""
        return [RequestOutput(
            f"{request_id}-{j}", None, b.tokens[:b.num_prompt_tokens],
            [CompletionOutput(j, b.text, b.output_token_ids, b.cum_logprob,
                              finish_reason=b.finish_reason)], finished=True)
            for j, b in enumerate(self.result(tokenizer).sequences)]
