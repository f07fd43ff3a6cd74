"""PNG figures of lab and sweep results (matplotlib's Agg backend: no display needed).

matplotlib is imported inside the functions: `specserve --help` must stay fast.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from specserve.bench.report import group_cells, pooled

_MB = 2**20


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _median_and_err(entry: dict | None) -> tuple[float, float, float]:
    """(median, distance down to min, distance up to max); NaN when missing."""
    if not entry:
        return float("nan"), 0.0, 0.0
    return entry["median"], entry["median"] - entry["min"], entry["max"] - entry["median"]


def _log2_axis(ax, xs: Sequence[int]) -> None:
    if len(set(xs)) > 1:
        ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(set(xs)))
    ax.set_xticklabels([str(x) for x in sorted(set(xs))])


def _vs_concurrency(points: Sequence[dict], figure: str, ylabel: str, title: str,
                    path: Path) -> Path:
    """One panel per workload, one line per strategy, error bars for the repetitions' spread."""
    plt = _pyplot()
    workloads = list(dict.fromkeys(p["workload"] for p in points))
    strategies = list(dict.fromkeys(p["strategy"] for p in points))
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.5 * len(workloads), 3.8),
                             squeeze=False)
    for ax, w in zip(axes[0], workloads, strict=True):
        for s in strategies:
            mine = sorted((p for p in points if p["strategy"] == s and p["workload"] == w),
                          key=lambda p: p["concurrency"])
            if not mine:
                continue
            xs = [p["concurrency"] for p in mine]
            ys, lo, hi = zip(*(_median_and_err(p["summary"].get(figure)) for p in mine),
                             strict=True)
            ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=s)
        _log2_axis(ax, [p["concurrency"] for p in points])
        ax.set_title(w)
        ax.set_xlabel("concurrency")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _grouped_bars(ax, groups: Sequence[str], series: dict[str, list[float]]) -> None:
    width = 0.8 / max(len(series), 1)
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, values, width, label=name)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups)


def acceptance_plot(results: dict, path: Path) -> Path:
    """Pooled acceptance rate per workload, one bar per speculating strategy (its proposer)."""
    plt = _pyplot()
    points = results["points"]
    workloads = list(dict.fromkeys(p["workload"] for p in points))
    series: dict[str, list[float]] = {}
    for s in results["strategies"]:
        cfg = (s.get("engine_kwargs") or {}).get("speculative_config")
        if s["status"] != "ok" or not cfg:
            continue
        rates = [pooled([p for p in points if p["strategy"] == s["name"]
                         and p["workload"] == w])["acceptance_rate"] for w in workloads]
        series[f"{s['name']} ({cfg['method']})"] = [float("nan") if r is None else r
                                                    for r in rates]
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(workloads)), 3.8))
    _grouped_bars(ax, workloads, series)
    ax.set_ylim(0, 1)
    ax.set_ylabel("acceptance rate")
    ax.set_title("draft-token acceptance by workload")
    if series:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def memory_rows(strategies: Sequence[dict]) -> list[dict]:
    """The strategies whose memory was measured (target_kv_bytes: the engine's rows). The
    baselines' KV is not measured, and llama.cpp's weights neither: drawn, they would read as
    zero bytes beside the engine's preallocated pool (the table shows them as "—")."""
    return [s for s in strategies if s["status"] == "ok" and s.get("target_kv_bytes")]


def memory_plot(results: dict, path: Path) -> Path:
    """Stacked bars per strategy: target weights, target KV pool, draft weights, draft KV."""
    plt = _pyplot()
    rows = memory_rows(results["strategies"])
    parts = [("target weights", "target_weight_bytes"), ("target KV", "target_kv_bytes"),
             ("draft weights", "draft_weight_bytes"), ("draft KV", "draft_kv_bytes")]
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(rows)), 4))
    bottom = [0.0] * len(rows)
    for label, key in parts:
        values = [(s.get(key) or 0) / _MB for s in rows]
        ax.bar([s["name"] for s in rows], values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("MiB")
    ax.set_title("memory: weights and KV pools")
    ax.tick_params(axis="x", rotation=30)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def lab_plots(results: dict, out: Path) -> list[Path]:
    points = results["points"]
    if not points:  # every strategy was skipped: nothing to draw (and no 0-panel figure)
        return []
    return [
        _vs_concurrency(points, "output_tok_s", "output tok/s", "throughput vs concurrency",
                        out / "throughput_vs_concurrency.png"),
        _vs_concurrency(points, "tpot_p50_ms", "TPOT p50 (ms)", "time per output token",
                        out / "tpot_vs_concurrency.png"),
        acceptance_plot(results, out / "acceptance_by_workload.png"),
        memory_plot(results, out / "memory_breakdown.png"),
    ]


def sweep_plots(cells: Sequence[dict], out: Path) -> list[Path]:
    """A PNG per proposer x workload: throughput and TPOT p50 vs concurrency, per policy."""
    plt = _pyplot()
    rows = group_cells(cells)
    paths = []
    for proposer, workload in dict.fromkeys((k[0], k[1]) for k in rows):
        keys = sorted((k for k in rows if k[:2] == (proposer, workload)), key=lambda k: k[2])
        policies = list(dict.fromkeys(p for k in keys for p in rows[k]))
        fig, (ax_t, ax_l) = plt.subplots(1, 2, figsize=(10, 3.8))
        for policy in policies:
            xs = [k[2] for k in keys if policy in rows[k]]
            runs = [rows[k][policy] for k in keys if policy in rows[k]]
            ax_t.plot(xs, [r.get("output_tok_s") or float("nan") for r in runs], marker="o",
                      label=policy)
            ax_l.plot(xs, [r.get("tpot_p50_ms") or float("nan") for r in runs], marker="o",
                      label=policy)
        for ax, label in ((ax_t, "output tok/s"), (ax_l, "TPOT p50 (ms)")):
            _log2_axis(ax, [k[2] for k in keys])
            ax.set_xlabel("concurrency")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        ax_t.legend(fontsize=7)
        fig.suptitle(f"{proposer} proposer · {workload}")
        fig.tight_layout()
        # A file name without the label's spaces, commas and parentheses (sweep.proposer_label)
        name = re.sub(r"[^\w.-]+", "_", proposer).strip("_")
        path = out / f"sweep_{name}_{workload}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths
