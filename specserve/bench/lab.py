"""`specserve bench lab`: the article's strategy table, measured on our engine.

Each strategy (a name plus engine kwargs) is built in a fresh process (bench/isolate.py says
why) and runs every workload at every concurrency as a *closed loop*: exactly `concurrency`
requests are in flight, and as soon as one finishes the next one joins the running batch
(continuous batching, not waves). Decoding is greedy; each request's `max_tokens` comes from its
workload item, capped by the preset. With `repeats`, every repetition builds every strategy
again, in an order rotated by one each time, so that no strategy always runs first or last.

Presets (run times from `estimate_seconds`: an upper bound on 2 CPU cores in bf16, assuming
prefill ~1000 tok/s and decode ~50 tok/s at batch 1 growing to ~700 tok/s at batch 32, every
request running to its max_tokens; requests that stop at EOS end sooner; measured times are in
the README):

- `quick`: prose, json, sql at concurrency 1 and 16, 8 prompts at 1 and 16 at 16, outputs capped
  at 48 tokens. rag is left out: its 2.5k-token prompts, prefilled in full by every strategy
  without prefix caching, took 7 of session 3's 11 quick minutes (`--workloads` adds it back).
- `full`: all 5 workloads at concurrency 1 and 32 (the seed's two columns; `bench sweep` draws
  the curve in between), max(2 x concurrency, 8) prompts per point, outputs capped at 64 tokens.
  Measured in session 4 in two parts: 8 min per repetition of prose, json, sql and chat-1, and
  33 min for rag alone.

Speculative strategies run with prefix caching off, like `vanilla`, so that speculation is the
only difference from the baseline; `cache+quant` is the one with prefix caching on.
"""

from __future__ import annotations

import functools
import gc
import logging
import multiprocessing
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

import torch

from specserve.bench.isolate import run_isolated
from specserve.bench.offline import percentile
from specserve.bench.workloads import (
    CONSTRAINED_WORKLOADS,
    WORKLOAD_NAMES,
    WorkloadItem,
    load_workload,
)
from specserve.engine.llm_engine import LLMEngine
from specserve.sampling_params import SamplingParams, StructuredOutputsParams

# Engine counters that a run reports as the difference between its end and its start.
_COUNTERS = ("num_steps", "num_prompt_tokens", "num_generated_tokens", "num_preemptions",
             "num_draft_tokens", "num_accepted_tokens", "num_verifications",
             "prefix_cache_queries", "prefix_cache_hits", "forward_time_s", "step_time_s",
             "draft_time_s", "verify_time_s", "spec_time_s", "num_jump_forward_tokens",
             "num_jump_forward_accepted", "draft_prefix_cache_hits")
_MEMORY = {"target_weight_bytes": "weight_bytes", "target_kv_bytes": "kv_cache_bytes",
           "draft_weight_bytes": "draft_weight_bytes", "draft_kv_bytes": "draft_kv_cache_bytes",
           "kv_blocks_total": "kv_blocks_total"}
_STUCK_STEPS = 10_000  # consecutive steps with no output: the engine cannot make progress
logger = logging.getLogger("specserve")


# ---- per-request records and the figures computed from them -------------------------------------
@dataclass(slots=True)
class RequestRecord:
    prompt_tokens: int
    output_tokens: int
    ttft_s: float
    tpot_s: float | None  # None for a one-token output: no inter-token interval exists
    start_s: float = 0.0  # when it was submitted, relative to the run's start
    end_s: float = 0.0  # when it finished, relative to the run's start
    num_draft_tokens: int = 0  # drafts verified for it, and how many were accepted
    num_accepted_tokens: int = 0


def _pct(xs: list[float], q: float) -> float | None:
    return percentile(xs, q) if xs else None  # JSON has no NaN


def request_acceptance(records: Sequence[RequestRecord]) -> dict:
    """How acceptance spreads over the requests that drafted: a mean of 0.5 may be every request
    at 0.5, or half at 0.9 and half at 0.1 (what a per-request controller is for)."""
    rates = [r.num_accepted_tokens / r.num_draft_tokens for r in records if r.num_draft_tokens]
    return {"requests_drafted": len(rates),
            **{f"request_acceptance_p{q}": _pct(rates, q) for q in (10, 50, 90)}}


def latency_figures(records: Sequence[RequestRecord], wall_s: float) -> dict:
    """Throughput and latency percentiles of one run (shared by the offline and online modes)."""
    ttft = [r.ttft_s * 1e3 for r in records]
    tpot = [r.tpot_s * 1e3 for r in records if r.tpot_s is not None]
    output_tokens = sum(r.output_tokens for r in records)
    return {
        "num_requests": len(records),
        "prompt_tokens": sum(r.prompt_tokens for r in records),
        "output_tokens": output_tokens,
        "wall_s": wall_s,
        "output_tok_s": output_tokens / wall_s if wall_s > 0 else None,
        "ttft_p50_ms": _pct(ttft, 50), "ttft_p99_ms": _pct(ttft, 99),
        "tpot_p50_ms": _pct(tpot, 50), "tpot_p99_ms": _pct(tpot, 99),
    }


# ---- workloads as token ids ---------------------------------------------------------------------
@dataclass(frozen=True)
class PreparedWorkload:
    """A workload rendered through the chat template, with each item's output budget."""

    name: str
    prompts: list[list[int]]
    max_tokens: list[int]
    structured_outputs: list[dict | None] | None = None  # per item, a constrained workload's
    # What each request's own fields go on top of: None, plain SamplingParams (the lab's); bench
    # online --compare-offline sets the engine's defaults, as a server fills a request's
    # unset fields (online.offline_workload).
    defaults: SamplingParams | None = None

    def params(self, i: int, ignore_eos: bool = False) -> SamplingParams:
        """Greedy sampling parameters of request i (cycling through the items)."""
        so = self.structured_outputs[i % len(self.prompts)] if self.structured_outputs else None
        return replace(self.defaults or SamplingParams(), temperature=0.0,
                       max_tokens=self.max_tokens[i % len(self.prompts)], ignore_eos=ignore_eos,
                       structured_outputs=StructuredOutputsParams(**so) if so else None)

    @property
    def shared_prefix(self) -> list[int]:
        """The token prefix every prompt starts with (rag's document and the chat preamble)."""
        first = self.prompts[0]
        n = min(len(p) for p in self.prompts)
        for p in self.prompts[1:]:
            n = next((i for i in range(n) if p[i] != first[i]), n)
        return first[:n]

    def take(self, n: int) -> list[tuple[list[int], int]]:
        """The first n requests, cycling through the items."""
        return [(self.prompts[i % len(self.prompts)], self.max_tokens[i % len(self.prompts)])
                for i in range(n)]


def item_max_tokens(item: WorkloadItem, cap: int | None = None, scale: float = 1.0) -> int:
    m = max(1, round(item.max_tokens * scale))
    return min(m, cap) if cap else m


def prepare_workload(engine: LLMEngine, name: str, items: Sequence[WorkloadItem] | None = None,
                     cap: int | None = None, scale: float = 1.0) -> PreparedWorkload:
    items = load_workload(name) if items is None else items
    constrained = [i.structured_outputs for i in items]
    workload = PreparedWorkload(name, [engine.apply_chat_template(i.messages) for i in items],
                                [item_max_tokens(i, cap, scale) for i in items],
                                constrained if any(constrained) else None)
    compile_grammars(engine, workload)
    return workload


def compile_grammars(engine: LLMEngine, workload: PreparedWorkload) -> None:
    """Compile a constrained workload's grammars on this engine (the first one also reads the
    vocabulary into xgrammar), so that it is not done inside the first timed run."""
    if workload.structured_outputs:
        for i in range(len(workload.prompts)):
            engine.compile_grammar(workload.params(i))


# ---- the closed loop ----------------------------------------------------------------------------
# Token counts at which each run records the adaptive policy's prices (cost_model_ms).
_PRICE_POINTS = (1, 2, 4, 8, 16, 17, 32, 33, 64)


def _prices(policy) -> dict | None:
    """The adaptive policy's predicted forward times (ms, online scale included) at a few token
    counts, for the target and the draft network. In session 31's lab one of four fresh EAGLE
    engines never drafted at concurrency 1 and drafted more than any other at 32: a start-up
    profile read during one of the VM's slow spells is the suspect, and these make the next one
    visible."""
    target = getattr(policy, "target_cost", None)
    if target is None:
        return None
    draft = getattr(policy, "draft_cost", None)
    return {"target": {n: round(target(n) * 1e3, 3) for n in _PRICE_POINTS},
            "draft": None if draft is None else
            {n: round(draft(n) * 1e3, 3) for n in _PRICE_POINTS}}


def _snapshot(engine: LLMEngine) -> dict:
    stats = engine.get_stats()
    policy = engine.spec_policy
    stats["_abs_error_s"] = policy.abs_error_s if policy else 0.0
    stats["_sum_actual_s"] = policy.sum_actual_s if policy else 0.0
    stats["_sum_predicted_s"] = policy.sum_predicted_s if policy else 0.0
    stats["_num_predictions"] = policy.num_predictions if policy else 0
    stats["_prices"] = _prices(policy)
    return stats


def engine_figures(before: dict, after: dict) -> dict:
    """What the engine did during one run: counter deltas, speculation and memory figures."""
    d = {k: after[k] - before[k] for k in _COUNTERS if k in after}
    hist = Counter(after.get("spec_k_histogram") or {})
    hist.subtract(before.get("spec_k_histogram") or {})
    drafted, accepted, verified = d["num_draft_tokens"], d["num_accepted_tokens"], \
        d["num_verifications"]
    actual = after["_sum_actual_s"] - before["_sum_actual_s"]
    predicted = after["_sum_predicted_s"] - before["_sum_predicted_s"]
    priced = after["_num_predictions"] - before["_num_predictions"]
    total_k = sum(hist.values())
    return {
        **d,
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_accepted_length": (accepted + verified) / verified if verified else None,
        "spec_k_histogram": {k: v for k, v in sorted(hist.items()) if v > 0},
        "spec_k_mean": sum(k * v for k, v in hist.items()) / total_k if total_k else None,
        "spec_step_time_rel_error": (after["_abs_error_s"] - before["_abs_error_s"]) / actual
        if actual else None,
        # the mean step the cost model priced, as predicted and as measured
        "spec_step_time_predicted_ms": 1e3 * predicted / priced if priced else None,
        "spec_step_time_actual_ms": 1e3 * actual / priced if priced else None,
        "prefix_cache_hit_rate": d["prefix_cache_hits"] / d["prefix_cache_queries"]
        if d.get("prefix_cache_queries") else None,
        "cost_model_ms": after.get("_prices"),  # at the run's end
        **{ours: after.get(theirs, 0) for ours, theirs in _MEMORY.items()},
    }


def run_workload(engine: LLMEngine, workload: PreparedWorkload, concurrency: int,
                 num_prompts: int, ignore_eos: bool = False,
                 reset_prefix_cache: bool = True, warm_shared_prefix: bool = False) -> dict:
    """Run `num_prompts` requests with exactly `concurrency` in flight, driving the engine's
    add_request/step loop directly so that a finished request is replaced before the next step.
    warm_shared_prefix: before the clock starts, put the prompts' common prefix (rag's document)
    in the prefix cache, as on a server where that document is hot.
    Returns the run's figures plus one record per request."""
    if reset_prefix_cache:
        engine.reset_prefix_cache()
    learns = getattr(engine.proposer, "learns_from_replies", False)
    if learns:
        # Suffix decoding guesses from earlier replies, and the runs here are greedy and cycle
        # through the workload: a prompt's second request would be guessed from its first
        # one's reply, which measures a cache of answers, not speculation. So a run starts with
        # no replies (not the last run's) and a request never sees its own prompt's.
        engine.proposer.reset_prefix_cache()
        engine.proposer.exclude_same_prompt = True
    prefix = workload.shared_prefix if warm_shared_prefix else []
    if len(prefix) >= engine.block_manager.block_size:
        # With a draft model, decoded with one draft: the draft then holds the document in its
        # own prefix cache too, as on a server that has drafted over it before (its one
        # verification counts in the policy's estimates, as it would there).
        params = SamplingParams(temperature=0.0, max_tokens=1)
        if getattr(engine.proposer, "prefix_cacheable", False):
            params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True,
                                    speculation_policy="static", num_speculative_tokens=1)
        engine.add_request(prefix, params)
        while engine.has_unfinished_requests():
            engine.step()
    todo = deque(enumerate(workload.take(num_prompts)))
    records: list[RequestRecord | None] = [None] * num_prompts
    in_flight: dict[str, int] = {}
    bm = engine.block_manager
    peak_blocks = max_in_flight = idle_steps = 0

    def read_blocks() -> None:
        """Blocks in use once the step is scheduled, before the forward: after it, the
        requests that finished have freed theirs and their successors hold none yet."""
        nonlocal peak_blocks
        peak_blocks = max(peak_blocks, bm.num_blocks - bm.num_free_blocks)
    before = _snapshot(engine)
    t0 = time.perf_counter()
    try:
        while todo or in_flight:
            while todo and len(in_flight) < concurrency:
                i, (prompt, _) = todo.popleft()
                params = workload.params(i, ignore_eos)
                in_flight[engine.add_request(prompt, params).request_id] = i
            max_in_flight = max(max_in_flight, len(in_flight))
            outputs = engine.step(on_forward=read_blocks)
            idle_steps = 0 if outputs else idle_steps + 1
            if idle_steps > _STUCK_STEPS:
                raise RuntimeError("the engine made no progress (is the KV pool too small?)")
            for out in outputs:
                if out.finished and out.request_id in in_flight:
                    records[in_flight.pop(out.request_id)] = _record(out, t0)
    finally:
        for rid in in_flight:  # interrupted: leave nothing running in the engine
            engine.abort_request(rid)
        if learns:
            engine.proposer.exclude_same_prompt = False
    wall = time.perf_counter() - t0
    done = [r for r in records if r is not None]
    return {"concurrency": concurrency, "num_prompts": num_prompts,
            **latency_figures(done, wall), **engine_figures(before, _snapshot(engine)),
            **request_acceptance(done),
            "kv_blocks_peak_used": peak_blocks, "max_in_flight": max_in_flight,
            "requests": [asdict(r) for r in done]}


def _record(out, t0: float) -> RequestRecord:
    m = out.metrics
    n = len(out.outputs[0].token_ids)
    tpot = (m.finished_time - m.first_token_time) / (n - 1) if n > 1 else None
    return RequestRecord(len(out.prompt_token_ids), n, m.first_token_time - m.arrival_time, tpot,
                         m.arrival_time - t0, m.finished_time - t0, m.num_draft_tokens,
                         m.num_accepted_tokens)


# ---- strategies and presets ---------------------------------------------------------------------
def at_least_concurrency(num_prompts: int, concurrency: int) -> int:
    """An asked-for number of prompts, raised to the concurrency: with fewer, a point labelled
    @32 would never have 32 requests in flight. Warned once per pair, by the main process
    only: the lab's spawned workers run the same preset, and the main one has already warned
    (estimate_seconds asks for every point first)."""
    if num_prompts < concurrency and multiprocessing.parent_process() is None:
        _warn_too_few_prompts(num_prompts, concurrency)
    return max(num_prompts, concurrency)


@functools.cache
def _warn_too_few_prompts(num_prompts: int, concurrency: int) -> None:
    logger.warning("%d prompts cannot keep %d requests in flight: running %d at concurrency %d",
                   num_prompts, concurrency, concurrency, concurrency)


@dataclass(frozen=True)
class Strategy:
    name: str
    engine_kwargs: dict
    # Empty the prefix cache before each run, so that a point never profits from the previous one.
    reset_prefix_cache: bool = True


def self_draft_layers(proposer: str, draft_model: str | None = None) -> int | None:
    """The layers of the target a `draft` / `draft:N` proposer copies as its (untrained) draft;
    None for a draft model (`draft` with draft_model) or another proposer."""
    if not proposer.startswith("draft") or (draft_model and proposer == "draft"):
        return None
    return int(proposer.split(":", 1)[1]) if ":" in proposer else 4


def proposer_config(proposer: str, k: int, *, draft_model: str | None = None,
                    eagle_model: str | None = None) -> dict:
    """A speculative_config. `draft` is the target's first 4 layers unless a trained draft
    directory is given; `draft:N` is the self-draft of the first N layers; `eagle` needs a
    trained head. The directories are keyword-only: one passed in the other's place was
    silently ignored (an untrained self-draft measured instead of the trained one)."""
    if proposer == "eagle":
        if eagle_model is None:
            raise ValueError("the eagle proposer needs a trained head: pass --eagle-model, or "
                             "train one (specserve train-draft --method eagle, or bench lab)")
        return {"method": "eagle", "model": eagle_model, "num_speculative_tokens": k}
    if proposer.startswith("draft"):
        layers = self_draft_layers(proposer, draft_model)
        if layers is None:
            return {"method": "draft", "model": draft_model, "num_speculative_tokens": k}
        return {"method": "draft", "draft_layers": layers, "num_speculative_tokens": k}
    return {"method": proposer, "num_speculative_tokens": k}


def builtin_strategies(draft_model: str | None = None, k: int = 4,
                       eagle_model: str | None = None) -> dict[str, Strategy]:
    """The article's rows. `draft_model`: a trained draft directory instead of the self-draft
    (the target's first 4 layers; adds its int4 row); `eagle_model`: a trained EAGLE head (adds
    the eagle rows)."""
    draft = proposer_config("draft", k, draft_model=draft_model)
    ngram = proposer_config("ngram", k)
    off = {"enable_prefix_caching": False}

    def spec(cfg: dict, policy: str) -> dict:
        return {**off, "speculative_config": cfg, "speculation_policy": policy}

    # vanilla speculates in no way, so not on what a grammar forces either (json-schema);
    # every other row drafts forced tokens as the engine does by default.
    rows = [Strategy("vanilla", {**off, "jump_forward_tokens": 0}),
            Strategy("draft-static", spec(draft, "static")),
            Strategy("ngram-static", spec(ngram, "static")),
            Strategy("adaptive-ngram", spec(ngram, "adaptive")),
            # Suffix decoding also guesses from the replies of the run's earlier requests
            # (run_workload empties that cache first and hides a prompt's own replies).
            Strategy("adaptive-suffix", spec(proposer_config("suffix", k), "adaptive")),
            Strategy("adaptive-draft", spec(draft, "adaptive"))]
    if draft_model is not None:
        # A trained draft's decoder in int4, calibrated (GPTQ) on the sequences it was trained
        # on: at one sequence its forward reads a quarter of the bytes.
        rows.append(Strategy("adaptive-draft-int4",
                             spec({**draft, "quantization": "int4"}, "adaptive")))
    if eagle_model is not None:
        eagle = proposer_config("eagle", k, eagle_model=eagle_model)
        rows += [Strategy("eagle-static", spec(eagle, "static")),
                 Strategy("adaptive-eagle", spec(eagle, "adaptive"))]
    rows.append(Strategy("cache+quant", {"enable_prefix_caching": True, "quantization": "int8",
                                         "jump_forward_tokens": 0,
                                         "kv_cache_dtype": "int8"}))
    # Keyed by the names --strategies takes; an untrained self-draft's rows say so in the
    # tables, plots and results.json (as bench sweep's cells do), not only in a printed notice.
    untrained = "" if draft_model is not None else \
        f" (self-{self_draft_layers('draft')}, untrained)"
    return {s.name: replace(s, name=s.name + untrained) if "draft" in s.name else s
            for s in rows}


@dataclass(frozen=True)
class Preset:
    name: str
    workloads: tuple[str, ...]
    concurrency: tuple[int, ...]
    prompts_factor: int = 2  # prompts per point: clamp(factor x concurrency, min, max)
    min_prompts: int = 8
    max_prompts: int | None = None
    num_prompts_override: int | None = None
    max_tokens_cap: int | None = None
    max_tokens_scale: float = 1.0
    repeats: int = 1
    ignore_eos: bool = False
    # Trained drafts whose training prompts are left out of every workload (trained.unseen_items)
    unseen_by: tuple[str, ...] = ()

    def items(self, name: str) -> list[WorkloadItem] | None:
        """The workload's items to run (None: all of them)."""
        if not self.unseen_by:
            return None
        from specserve.bench.trained import unseen_items  # trained imports the train package

        return unseen_items(name, self.unseen_by)

    def num_prompts(self, concurrency: int) -> int:
        if self.num_prompts_override:
            return at_least_concurrency(self.num_prompts_override, concurrency)
        n = max(self.prompts_factor * concurrency, self.min_prompts)
        # Never fewer prompts than the concurrency: the point would not reach it.
        return max(min(n, self.max_prompts) if self.max_prompts else n, concurrency)


PRESETS = {
    "quick": Preset("quick", ("prose", "json", "sql"), (1, 16), prompts_factor=1, min_prompts=8,
                    max_prompts=16, max_tokens_cap=48),
    # json-schema (json under its schemas) on request: --workloads json-schema
    "full": Preset("full", tuple(w for w in WORKLOAD_NAMES if w not in CONSTRAINED_WORKLOADS),
                   (1, 32), max_tokens_cap=64),
}


def estimate_seconds(preset: Preset, strategies: Sequence[Strategy],
                     prefill_tok_s: float = 1000.0) -> float:
    """A rough upper bound of a lab run on 2 cores (bf16): every request runs to its max_tokens,
    decode throughput is 50*c/(1+c/24) tok/s at batch c, prompts are prefilled cold (with
    prefix caching, rag's shared document once per point), a process and its engine take ~9 s
    to start and the adaptive policy's start-up profile ~6 s more, every repetition."""
    decode = prefill_cold = prefill_cached = 0.0
    for name in preset.workloads:
        items = load_workload(name)
        tokens = [sum(len(m["content"]) for m in i.messages) / 4 for i in items]  # ~4 chars
        outs = [item_max_tokens(i, preset.max_tokens_cap, preset.max_tokens_scale) for i in items]
        for c in preset.concurrency:
            n = preset.num_prompts(c)
            prompts = [tokens[j % len(items)] for j in range(n)]
            decode += sum(outs[j % len(items)] for j in range(n)) / (50 * c / (1 + c / 24))
            # Attention makes long prompts slower per token: rag's 2.5k-token prompts prefilled
            # in 33 min in session 4, against 24 min estimated without this term.
            slow = [t * (1 + t / 3000) for t in prompts]
            prefill_cold += sum(slow) / prefill_tok_s
            shared = min(slow) * 0.9 if name == "rag" else 0.0
            prefill_cached += (sum(slow) - shared * (n - 1)) / prefill_tok_s
    total = 0.0
    for s in strategies:
        cached = s.engine_kwargs.get("enable_prefix_caching", True)  # the engine's default
        run = decode + (prefill_cached if cached else prefill_cold)
        setup = 15.0 if s.engine_kwargs.get("speculation_policy") == "adaptive" else 9.0
        total += (run + setup) * preset.repeats
    return total


# ---- the lab ------------------------------------------------------------------------------------
Progress = Callable[[str, int], None]  # (description, points just finished)


@dataclass
class LabRun:
    strategies: list[dict] = field(default_factory=list)
    points: list[dict] = field(default_factory=list)
    workloads: dict[str, PreparedWorkload] = field(default_factory=dict)
    eos_token_ids: tuple[int, ...] = ()  # the model's, for the baselines' stopping rule


def warm_up(engine: LLMEngine) -> None:
    """First forwards are slow (allocation, kernel selection): keep them out of the figures."""
    prompt = engine.tokenize("Speculative decoding is")
    for _ in range(2):
        engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
        while engine.has_unfinished_requests():
            engine.step()


def shortest_workload(workloads: Sequence[PreparedWorkload]) -> PreparedWorkload:
    """The workload whose prompts are shortest on average: a warm-up's cheapest full batch."""
    return min(workloads, key=lambda w: sum(map(len, w.prompts)) / len(w.prompts))


def warm_up_batches(engine: LLMEngine, workloads: Sequence[PreparedWorkload],
                    concurrency: int) -> None:
    """An untimed closed loop at the lab's highest concurrency (8 tokens a request, the
    workload with the shortest prompts): every strategy's first large prefill and decode
    batches fall outside its timed runs. An adaptive engine's start-up profile runs such
    forwards anyway; the others paid for theirs in their first timed point."""
    if concurrency <= 1 or not workloads:
        return
    shortest = shortest_workload(workloads)
    short = replace(shortest, max_tokens=[min(m, 8) for m in shortest.max_tokens],
                    structured_outputs=None)
    run_workload(engine, short, concurrency, concurrency, ignore_eos=True)
    engine.reset_prefix_cache()


def build_llm(model: str | None, kwargs: dict):
    from specserve.llm import LLM

    return LLM(model, **kwargs)


def run_strategy(strategy: Strategy, preset: Preset, common: dict, model: str | None,
                 lab: LabRun, progress: Progress) -> None:
    """Build one engine and run every workload x concurrency x repeat on it. An engine that
    refuses its options (one not implemented yet) becomes a 'skipped' row, not a crash."""
    num_points = len(preset.workloads) * len(preset.concurrency)
    progress(f"{strategy.name}: loading", 0)
    row = {"name": strategy.name, "engine_kwargs": strategy.engine_kwargs}
    try:
        llm = build_llm(model, {**common, **strategy.engine_kwargs})
        warm_up(llm.engine)
    except (ValueError, NotImplementedError, ImportError) as exc:
        lab.strategies.append({**row, "status": "skipped", "error": f"{type(exc).__name__}: {exc}"})
        progress(f"{strategy.name}: skipped", num_points)
        return
    engine = llm.engine
    for name in preset.workloads:
        if name not in lab.workloads:  # rendered once, by the first engine that loads
            lab.workloads[name] = prepare_workload(engine, name, preset.items(name),
                                                   cap=preset.max_tokens_cap,
                                                   scale=preset.max_tokens_scale)
    lab.eos_token_ids = engine.model_config.eos_token_ids
    stats = engine.get_stats()
    lab.strategies.append({**row, "status": "ok", "load_time_s": engine.load_time,
                           "profile_time_s": engine.profile_time,
                           # what the baselines are given too (baselines.engine_threads)
                           "num_threads": torch.get_num_threads(),
                           **{ours: stats.get(theirs, 0) for ours, theirs in _MEMORY.items()}})
    warm_up_batches(engine, [lab.workloads[n] for n in preset.workloads],
                    max(preset.concurrency))
    for name in preset.workloads:
        for c in preset.concurrency:
            if engine.spec_policy is not None:
                # A fresh policy per point: what adaptive learned on the last one (its
                # acceptance, its standing plan) is not this one's, and a point's figures must
                # not depend on which ran before it. The start-up profile is kept.
                engine.set_speculation_policy(engine.config.speculation_policy)
            progress(f"{strategy.name} · {name} · c={c}", 0)
            runs = [run_workload(engine, lab.workloads[name], c, preset.num_prompts(c),
                                 preset.ignore_eos, strategy.reset_prefix_cache)
                    for _ in range(preset.repeats)]
            lab.points.append({"strategy": strategy.name, "workload": name, "concurrency": c,
                               "runs": runs})
            progress(f"{strategy.name} · {name} · c={c}", 1)
    del engine, llm
    gc.collect()  # free this engine's weights and KV pool before the next one is built


def strategy_lab(strategy: Strategy, preset: Preset, common: dict, model: str | None,
                 progress: Progress) -> LabRun:
    """One strategy's part of the lab (what a fresh process runs and sends back)."""
    lab = LabRun()
    run_strategy(strategy, preset, common, model, lab, progress)
    return lab


def run_lab(strategies: Sequence[Strategy], preset: Preset, common: dict,
            model: str | None = None, progress: Progress | None = None,
            isolate: bool = True) -> LabRun:
    """Every strategy x workload x concurrency, `preset.repeats` times. isolate: each strategy
    of each repetition in a fresh process (False: all in this one, for quick experiments)."""
    lab = LabRun()
    progress = progress or (lambda desc, n: None)
    max_c = max(preset.concurrency)
    common = {"max_num_seqs": max(max_c, 128), **common}
    once = replace(preset, repeats=1)
    num_points = len(preset.workloads) * len(preset.concurrency)
    skipped: set[str] = set()
    for rep in range(preset.repeats):
        first = rep % len(strategies)
        for s in [*strategies[first:], *strategies[:first]]:
            if s.name in skipped:
                progress(f"{s.name}: skipped", num_points)
                continue
            args = (s, once, common, model)
            part = (run_isolated(strategy_lab, args, progress) if isolate
                    else strategy_lab(*args, progress))
            _merge(lab, part, skipped)
    return lab


def _merge(lab: LabRun, part: LabRun, skipped: set[str]) -> None:
    """Add one strategy's repetition: its row the first time, its runs to the points."""
    (row,) = part.strategies
    if row["status"] != "ok":
        skipped.add(row["name"])
    if all(r["name"] != row["name"] for r in lab.strategies):
        lab.strategies.append(row)
    points = {(p["strategy"], p["workload"], p["concurrency"]): p for p in lab.points}
    for p in part.points:
        known = points.get((p["strategy"], p["workload"], p["concurrency"]))
        if known is None:
            lab.points.append(p)
        else:
            known["runs"].extend(p["runs"])
    for name, wl in part.workloads.items():
        lab.workloads.setdefault(name, wl)
    lab.eos_token_ids = lab.eos_token_ids or part.eos_token_ids


def with_overrides(preset: Preset, **overrides) -> Preset:
    """The preset with the options given on the command line (None: keep the preset's)."""
    return replace(preset, **{k: v for k, v in overrides.items() if v is not None})
