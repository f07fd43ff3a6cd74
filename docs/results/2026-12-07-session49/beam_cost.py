"""What beam search costs over greedy decoding on the embedded model (bf16): 4 prompts, 32 new
tokens, greedy against beam widths 2 and 4 (ignore_eos, so every search runs all 32 steps), on
one engine, interleaved rounds.

    HF_HUB_OFFLINE=1 .venv/bin/python docs/results/2026-12-07-session49/beam_cost.py
"""

from __future__ import annotations

import statistics
import time

ROUNDS = 3
PROMPTS = ["The capital of France is", "Write a haiku about the sea.",
           "Explain speculative decoding in one sentence.", "SELECT name FROM users WHERE"]


def main() -> None:
    from specserve import LLM, BeamSearchParams, SamplingParams

    llm = LLM()
    greedy = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    llm.generate(PROMPTS, greedy)
    llm.beam_search(PROMPTS, BeamSearchParams(beam_width=2, max_tokens=4, ignore_eos=True))
    times: dict[str, list[float]] = {}
    for _ in range(ROUNDS):
        for name, run in (("greedy", lambda: llm.generate(PROMPTS, greedy)),
                          ("beam 2", lambda: llm.beam_search(PROMPTS, BeamSearchParams(
                              beam_width=2, max_tokens=32, ignore_eos=True))),
                          ("beam 4", lambda: llm.beam_search(PROMPTS, BeamSearchParams(
                              beam_width=4, max_tokens=32, ignore_eos=True)))):
            t = time.perf_counter()
            run()
            times.setdefault(name, []).append(time.perf_counter() - t)
    base = statistics.median(times["greedy"])
    for name, ts in times.items():
        print(f"{name}: {statistics.median(ts):.2f} s for 4 x 32 tokens "
              f"({statistics.median(ts) / base:.1f}x greedy; runs "
              f"{' / '.join(f'{t:.2f}' for t in ts)})")
    stats = llm.get_stats()
    print(f"prefix cache: {stats['prefix_cache_hits']} of {stats['prefix_cache_queries']} "
          "prompt tokens hit")


if __name__ == "__main__":
    main()
