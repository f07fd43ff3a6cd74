"""`specserve bench sweep`: does `adaptive` pick the best policy at every point?

For each proposer it builds one engine per policy (`static:K` is the static policy with
K = num_speculative_tokens; the others use --k-max as K_max) and runs the concurrency x workload
matrix on it as closed loops (lab.run_workload). Prefix caching is on and emptied before every
point: rag's long shared document is prefilled a few times per point instead of once per
request, so the sweep's time goes to decoding, which is what the policies change.

Default matrix (2 proposers x 5 policies x 3 workloads x concurrency 1..64, max(2c, 8) prompts
per point, at most 64 output tokens): ~4 minutes per engine by lab.estimate_seconds, so about
40-50 minutes on 2 cores in bf16 (the draft proposer's engines are the slower ones).
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import dataclass

from specserve.bench.lab import (
    Preset,
    Progress,
    build_llm,
    prepare_workload,
    proposer_config,
    run_workload,
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
                            max_tokens_cap=64)
    k_max: int = 4
    draft_model: str | None = None
    enable_prefix_caching: bool = True


def run_sweep(settings: SweepSettings, common: dict, model: str | None = None,
              progress: Progress | None = None) -> tuple[list[dict], list[dict]]:
    """Returns (cells, engines). A cell is one proposer x policy x workload x concurrency run;
    an engine row has its load and profile times, or the error that skipped it."""
    progress = progress or (lambda desc, n: None)
    pts = settings.points
    per_engine = len(pts.workloads) * len(pts.concurrency)
    common = {"max_num_seqs": max(max(pts.concurrency), 128), **common,
              "enable_prefix_caching": settings.enable_prefix_caching}
    cells: list[dict] = []
    engines: list[dict] = []
    workloads: dict = {}
    for proposer in settings.proposers:
        for policy in settings.policies:
            name, k = parse_policy(policy, settings.k_max)
            kwargs = {**common, "speculative_config": proposer_config(proposer, k,
                                                                      settings.draft_model),
                      "speculation_policy": name}
            progress(f"{proposer} · {policy}: loading", 0)
            row = {"proposer": proposer, "policy": policy, "engine_kwargs": kwargs}
            try:
                llm = build_llm(model, kwargs)
                warm_up(llm.engine)
            except (ValueError, NotImplementedError, ImportError) as exc:
                engines.append({**row, "status": "skipped",
                                "error": f"{type(exc).__name__}: {exc}"})
                progress(f"{proposer} · {policy}: skipped", per_engine)
                continue
            engines.append({**row, "status": "ok", "load_time_s": llm.engine.load_time,
                            "profile_time_s": llm.engine.profile_time})
            for w in pts.workloads:
                if w not in workloads:
                    workloads[w] = prepare_workload(llm.engine, w, cap=pts.max_tokens_cap,
                                                    scale=pts.max_tokens_scale)
                for c in pts.concurrency:
                    progress(f"{proposer} · {policy} · {w} · c={c}", 0)
                    run = run_workload(llm.engine, workloads[w], c, pts.num_prompts(c),
                                       pts.ignore_eos)
                    cells.append({"proposer": proposer, "policy": policy, "workload": w,
                                  "concurrency": c, "run": run})
                    progress(f"{proposer} · {policy} · {w} · c={c}", 1)
            del llm
            gc.collect()
    return cells, engines


def summarize_sweep(cells: Sequence[dict], tolerance: float = 0.97) -> dict:
    """The points where adaptive loses: to the best other policy by more than 3%, or to off."""
    below_best, below_off, ratios = [], [], []
    for (proposer, workload, c), row in group_cells(cells).items():
        r = adaptive_ratios(row)
        if r["vs_best"] is None and r["vs_off"] is None:
            continue
        where = {"proposer": proposer, "workload": workload, "concurrency": c, **r}
        ratios.append(where)
        if r["vs_best"] is not None and r["vs_best"] < tolerance:
            below_best.append(where)
        if r["vs_off"] is not None and r["vs_off"] < 1.0:
            below_off.append(where)
    return {"tolerance": tolerance, "ratios": ratios, "adaptive_below_best": below_best,
            "adaptive_below_off": below_off}


def summary_lines(summary: dict) -> list[str]:
    def where(p: dict) -> str:
        return f"{p['proposer']}/{p['workload']}/c={p['concurrency']}"

    tol = summary["tolerance"]
    best = summary["adaptive_below_best"]
    off = summary["adaptive_below_off"]
    return [
        f"adaptive < {tol:.2f}x the best other policy at {len(best)} point(s)"
        + (": " + ", ".join(f"{where(p)} ({p['vs_best']:.2f}x {p['best_other']})" for p in best)
           if best else ""),
        f"adaptive < 1.00x off at {len(off)} point(s)"
        + (": " + ", ".join(f"{where(p)} ({p['vs_off']:.2f}x)" for p in off) if off else ""),
    ]
