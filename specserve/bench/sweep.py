"""`specserve bench sweep`: does `adaptive` pick the best policy at every point?

One engine per proposer; every policy runs on that same instance (`set_speculation_policy`),
because two instances of one engine differ by up to ~10% in speed on this machine — more than
the policies being compared. Each point (workload x concurrency) runs every policy `repeats`
times, interleaved with the order rotated per round, so slow spells of the machine spread over
all policies; a cell reports the run with the median throughput and the spread of all rounds.

Runs are closed loops (lab.run_workload) of three waves: prompts = 3 x concurrency, at least 8.
A run of one wave measured the makespan of one batch, whose requests start together and end
together unless every one of them drafts well, and whose tail runs a shrinking batch; a server
at concurrency C runs C requests at every step and replaces a finished one at once. Prefix
caching is on, emptied before every run and then warmed with the workload's shared prefix
(rag's document, hot as on a real RAG server, in a draft model's pool too): the sweep's time
goes to decoding, which is what the policies change. Requests cycle through the workload's
items, so where a run has more requests than items (3 x 32 over prose's 70, or over the fewer
held-out prompts of --prompts unseen) a repeated prompt finds its whole prefill cached: every
policy alike, so the ratios stay fair, but absolute tok/s is more decode-heavy than the
prompts alone suggest (each cell's prefix_cache_hit_rate is in sweep.json).

The `draft` proposer is the target's own first 4 layers, untrained (`draft:N`, N layers), unless
--draft-model names a trained one: its cells are labelled `draft(self-4, untrained)`, a straw man
(trained.py), not what a trained draft model would do.

`static:K` is the static policy with K_max = K; the others use --k-max.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import dataclass

from specserve.bench.lab import (
    Preset,
    Progress,
    build_llm,
    compile_grammars,
    prepare_workload,
    proposer_config,
    run_workload,
    self_draft_layers,
    warm_up,
)
from specserve.bench.report import adaptive_ratios, group_cells

DEFAULT_POLICIES = ("off", "static:2", "static:4", "batch-threshold:8", "adaptive")


def parse_policy(spec: str, k_max: int) -> tuple[str, int]:
    """'static:2' -> ('static', 2); any other policy keeps the sweep's K_max."""
    if spec.startswith("static:"):
        return "static", int(spec.split(":", 1)[1])
    return spec, k_max


@dataclass(frozen=True)
class SweepSettings:
    proposers: tuple[str, ...] = ("ngram", "draft")
    policies: tuple[str, ...] = DEFAULT_POLICIES
    points: Preset = Preset("sweep", ("prose", "json", "rag"), (1, 2, 4, 8, 16, 32, 64),
                            prompts_factor=3, max_tokens_cap=32, repeats=3)
    k_max: int = 4
    draft_model: str | None = None
    enable_prefix_caching: bool = True
    eagle_model: str | None = None


def median_run(runs: list[dict]) -> dict:
    """The run with the median throughput (its figures stay mutually consistent; of an even
    count the lower middle, bench's one median rule), plus the throughput of every round."""
    ranked = sorted(runs, key=lambda r: r["output_tok_s"])
    mid = ranked[(len(ranked) - 1) // 2]
    tputs = [r["output_tok_s"] for r in runs]
    return {**mid, "output_tok_s_runs": tputs,
            "output_tok_s_spread": (max(tputs) - min(tputs)) / mid["output_tok_s"]
            if min(tputs) > 0 else None}


def proposer_label(proposer: str, draft_model: str | None = None) -> str:
    """The name a proposer's cells, table rows and summary carry: a self-draft (the target's
    first layers, untrained) is never just `draft`, which reads as a draft model."""
    layers = self_draft_layers(proposer, draft_model)
    return proposer if layers is None else f"draft(self-{layers}, untrained)"


def run_sweep(settings: SweepSettings, common: dict, model: str | None = None,
              progress: Progress | None = None) -> tuple[list[dict], list[dict]]:
    """Returns (cells, engines). A cell is one proposer x policy x workload x concurrency; an
    engine row has its load and profile times, or the error that skipped it."""
    progress = progress or (lambda desc, n: None)
    pts = settings.points
    policies = list(settings.policies)
    per_engine = len(pts.workloads) * len(pts.concurrency) * len(policies)
    common = {"max_num_seqs": max(max(pts.concurrency), 128), **common,
              "enable_prefix_caching": settings.enable_prefix_caching}
    cells: list[dict] = []
    engines: list[dict] = []
    workloads: dict = {}
    for proposer in settings.proposers:
        label = proposer_label(proposer, settings.draft_model)
        progress(f"{label}: loading", 0)
        row = {"proposer": label, "policies": policies}
        try:
            kwargs = {**common, "speculative_config": proposer_config(
                proposer, settings.k_max, draft_model=settings.draft_model,
                eagle_model=settings.eagle_model),
                "speculation_policy": "adaptive"}  # profiles the cost model at start-up
            row["engine_kwargs"] = kwargs
            llm = build_llm(model, kwargs)
            warm_up(llm.engine)
        except (ValueError, NotImplementedError, ImportError) as exc:
            engines.append({**row, "status": "skipped", "error": f"{type(exc).__name__}: {exc}"})
            progress(f"{label}: skipped", per_engine)
            continue
        engine = llm.engine
        engines.append({**row, "status": "ok", "load_time_s": engine.load_time,
                        "profile_time_s": engine.profile_time})
        for w in pts.workloads:
            if w not in workloads:
                workloads[w] = prepare_workload(engine, w, pts.items(w), cap=pts.max_tokens_cap,
                                                scale=pts.max_tokens_scale)
            else:  # rendered by an earlier engine: its grammars compile on this one, untimed
                compile_grammars(engine, workloads[w])
            # One policy object per workload, reinstalled at every switch: what it learned
            # (the workload's acceptance, the cost model's scale) carries over from run to run
            # as on a server that keeps serving that workload.
            installed: dict[str, object] = {}
            for c in pts.concurrency:
                progress(f"{label} · {w} · c={c}", 0)
                runs: dict[str, list[dict]] = {p: [] for p in policies}
                for r in range(pts.repeats):
                    for policy in policies[r % len(policies):] + policies[:r % len(policies)]:
                        if policy in installed:
                            engine.spec_policy = installed[policy]
                            # the last policy's standing plan is not this one's
                            engine.planner.reset()
                        else:
                            engine.set_speculation_policy(*parse_policy(policy, settings.k_max))
                            installed[policy] = engine.spec_policy
                        runs[policy].append(run_workload(engine, workloads[w], c,
                                                         pts.num_prompts(c), pts.ignore_eos,
                                                         warm_shared_prefix=True))
                for policy in policies:
                    cells.append({"proposer": label, "policy": policy, "workload": w,
                                  "concurrency": c, "run": median_run(runs[policy])})
                progress(f"{label} · {w} · c={c}", len(policies))
        del engine, llm
        gc.collect()
    return cells, engines


def summarize_sweep(cells: Sequence[dict], tolerance: float = 0.97) -> dict:
    """The points where adaptive loses: to the best other policy by more than 3%, or to off."""
    below_best, below_off, ratios = [], [], []
    for (proposer, workload, c), row in group_cells(cells).items():
        r = adaptive_ratios(row)
        if r["vs_best"] is None and r["vs_off"] is None:
            continue
        where = {"proposer": proposer, "workload": workload, "concurrency": c, **r,
                 **spec_overhead(row["adaptive"]), **rounds_below_off(row)}
        ratios.append(where)
        if r["vs_best"] is not None and r["vs_best"] < tolerance:
            below_best.append(where)
        if r["vs_off"] is not None and r["vs_off"] < 1.0:
            below_off.append(where)
    return {"tolerance": tolerance, "ratios": ratios, "adaptive_below_best": below_best,
            "adaptive_below_off": below_off}


def rounds_below_off(row: dict[str, dict]) -> dict:
    """In how many rounds adaptive ran slower than `off` (runs of a round are adjacent in
    time): a median below 1.0 from rounds that straddle it is the machine's noise as often as
    a loss; one below in every round is not."""
    mine = row["adaptive"].get("output_tok_s_runs") or []
    off = (row.get("off") or {}).get("output_tok_s_runs") or []
    if len(mine) < 2 or len(off) != len(mine):
        return {}
    return {"rounds": len(mine),
            "rounds_below_off": sum(a < b for a, b in zip(mine, off, strict=True))}


def spec_overhead(run: dict) -> dict:
    """Whether adaptive drafted at all, and the share of its step time spent on speculation
    outside the target's forward. A point where it drafted nothing did the work of `off` plus
    exactly that share: its throughput gap to `off` beyond the share is the machine's noise."""
    step, spec = run.get("step_time_s"), run.get("spec_time_s")
    # Forced drafts under a grammar (json-schema) are drafts too: `off` turns them off as well.
    return {"drafted": bool(run.get("num_draft_tokens") or run.get("num_jump_forward_tokens")),
            "spec_time_frac": spec / step if step and spec is not None else None}


def summary_lines(summary: dict) -> list[str]:
    def where(p: dict) -> str:
        return f"{p['proposer']}/{p['workload']}/c={p['concurrency']}"

    def rounds(p: dict) -> str:
        return f", below in {p['rounds_below_off']} of {p['rounds']} rounds" if "rounds" in p \
            else ""

    tol = summary["tolerance"]
    best = summary["adaptive_below_best"]
    off = summary["adaptive_below_off"]
    idle = [p["spec_time_frac"] for p in summary["ratios"]
            if not p.get("drafted") and p.get("spec_time_frac") is not None]
    overhead = ([f"adaptive drafted nothing at {len(idle)} point(s) (in their median run); "
                 f"there its speculation bookkeeping took at most {max(idle):.2%} of the step "
                 "time"] if idle else [])
    return [
        f"adaptive < {tol:.2f}x the best other policy at {len(best)} point(s)"
        + (": " + ", ".join(f"{where(p)} ({p['vs_best']:.3f}x {p['best_other']})" for p in best)
           if best else ""),
        f"adaptive < 1.00x off at {len(off)} point(s)"
        + (": " + ", ".join(f"{where(p)} ({p['vs_off']:.3f}x{rounds(p)})" for p in off)
           if off else ""),
        *overhead,
    ]
