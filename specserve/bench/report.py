"""Turning runs into results: the median and spread over repetitions, the JSON file, and the
rich tables that `bench lab`, `bench sweep` and `bench online` print."""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

_NOT_FIGURES = {"requests", "concurrency", "num_prompts"}
# Counters pooled over all of a (strategy, workload)'s runs for the table's right-hand columns.
_POOLED = ("num_draft_tokens", "num_accepted_tokens", "num_verifications", "num_preemptions")


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def summarize_runs(runs: Sequence[dict]) -> dict:
    """Each figure of the repetitions as {"median", "min", "max"} (None where no run has it);
    K histograms are summed. The median of an even count is the lower middle, as everywhere in
    bench (sweep.median_run picks that run): a value some run measured, and the same one the
    speculation table's median run shows."""
    out: dict = {}
    keys = dict.fromkeys(k for r in runs for k in r if k not in _NOT_FIGURES)
    for k in keys:
        values = [r.get(k) for r in runs]
        if k == "spec_k_histogram":
            total: Counter = Counter()
            for v in values:
                total.update(v or {})
            out[k] = dict(sorted(total.items()))
            continue
        nums = [v for v in values if _is_number(v) and math.isfinite(v)]
        out[k] = ({"median": statistics.median_low(nums), "min": min(nums), "max": max(nums)}
                  if nums else None)
    return out


def pooled(points: Sequence[dict]) -> dict:
    """Speculation and preemption figures over every run of the given points."""
    sums = {k: sum(r.get(k) or 0 for p in points for r in p["runs"]) for k in _POOLED}
    drafted, accepted, verified = (sums["num_draft_tokens"], sums["num_accepted_tokens"],
                                   sums["num_verifications"])
    return {**sums,
            "acceptance_rate": accepted / drafted if drafted else None,
            "mean_accepted_length": (accepted + verified) / verified if verified else None}


def add_summaries(points: Sequence[dict]) -> list[dict]:
    return [{**p, "summary": summarize_runs(p["runs"])} for p in points]


def _clean(obj):
    """JSON without NaN/inf (not valid JSON) and with plain keys."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_clean(data), indent=1, allow_nan=False))


# ---- formatting ---------------------------------------------------------------------------------
def fmt(entry: dict | float | None, digits: int = 1, scale: float = 1.0) -> str:
    """A figure, or its median with the min..max spread when repetitions differ."""
    if entry is None:
        return "—"
    if not isinstance(entry, dict):
        return f"{entry * scale:.{digits}f}"
    med, lo, hi = (entry[k] * scale for k in ("median", "min", "max"))
    text = f"{med:.{digits}f}"
    return text if lo == hi else f"{text} [{lo:.{digits}f}–{hi:.{digits}f}]"


def _tput(v: float | None) -> str:
    """Throughput: one decimal below 100 tok/s, where the tiny runs and batch 1 live."""
    return "—" if v is None else f"{v:.1f}" if v < 100 else f"{v:.0f}"


def _tput_entry(entry: dict | None) -> str:
    return fmt(entry, 1 if entry and entry["median"] < 100 else 0)


def _mb(n: float | None) -> str:
    return "—" if n is None else f"{n / 2**20:.0f}"


def _find(points: Sequence[dict], strategy: str, workload: str, c: int) -> dict | None:
    return next((p for p in points if (p["strategy"], p["workload"], p["concurrency"])
                 == (strategy, workload, c)), None)


def _engine_concurrencies(results: dict) -> list[int]:
    """The concurrencies the engine's strategies ran (the rows with a KV pool): the baselines
    add points at 1 whatever the preset says, which would leave every engine row's @lo blank.
    All points' where there is no engine row."""
    engines = {s["name"] for s in results["strategies"] if s.get("kv_blocks_total")}
    points = results["points"]
    ours = [p for p in points if p["strategy"] in engines] or points
    return sorted({p["concurrency"] for p in ours}) or [1]


def lab_table(results: dict) -> Table:
    """Strategy x workload: per-stream speed at the engines' lowest concurrency, throughput and
    TTFT at their highest, speculation, memory and preemptions."""
    points = results["points"]
    conc = _engine_concurrencies(results)
    lo, hi = conc[0], conc[-1]
    t = Table(title=f"specserve bench lab — {results['machine'].get('cpu_model', '')}")
    for name, justify in [("strategy", "left"), ("workload", "left"),
                          (f"TPOT p50 ms @{lo}", "right"), (f"tok/s/stream @{lo}", "right"),
                          (f"tok/s @{hi}", "right"), (f"TTFT p50/p99 ms @{hi}", "right"),
                          (f"prefix hit % @{hi}", "right"),
                          ("accept", "right"), ("acc len", "right"),
                          ("target MiB W+KV", "right"), ("draft MiB W+KV", "right"),
                          ("KV blocks peak/total", "right"), (f"preempt @{hi}", "right")]:
        t.add_column(name, justify=justify, no_wrap=justify == "left")
    workloads = list(dict.fromkeys(p["workload"] for p in points))
    for s in results["strategies"]:
        if s["status"] != "ok":
            t.add_row(s["name"], "(skipped)", *["—"] * 11)
            continue
        for w in workloads:
            mine = [p for p in points if p["strategy"] == s["name"] and p["workload"] == w]
            if not mine:
                continue
            low, high = _find(mine, s["name"], w, lo), _find(mine, s["name"], w, hi)
            ls, hs = (low or {}).get("summary", {}), (high or {}).get("summary", {})
            pool = pooled(mine)
            acc = pool["acceptance_rate"]
            mal = pool["mean_accepted_length"]
            peak = max((r.get("kv_blocks_peak_used") or 0) for p in mine for r in p["runs"])
            ttft = f"{fmt(hs.get('ttft_p50_ms'), 0)}/{fmt(hs.get('ttft_p99_ms'), 0)}" if hs \
                else "—"
            t.add_row(
                # output_tok_s is the aggregate over lo streams: per stream is 1/lo of it.
                s["name"], w, fmt(ls.get("tpot_p50_ms"), 1),
                fmt(ls.get("output_tok_s"), 1, scale=1 / lo),
                _tput_entry(hs.get("output_tok_s")), ttft,
                # A point cycles its workload's items (~10 unseen ones at 64 requests): the
                # strategy with prefix caching also skips the prefills of exact repeats, which
                # no other row can. Shown, so that its throughput is read with it.
                fmt(hs.get("prefix_cache_hit_rate"), 0, scale=100),
                "—" if acc is None else f"{acc:.2f}", "—" if mal is None else f"{mal:.2f}",
                f"{_mb(s.get('target_weight_bytes'))}+{_mb(s.get('target_kv_bytes'))}",
                f"{_mb(s.get('draft_weight_bytes'))}+{_mb(s.get('draft_kv_bytes'))}"
                if s.get("draft_weight_bytes") else "—",
                f"{peak}/{s['kv_blocks_total']}" if s.get("kv_blocks_total") else "—",
                # Per run, as the columns beside it (the pooled sum grew with --repeats).
                fmt(hs.get("num_preemptions"), 0))
    return t


def skipped_lines(strategies: Sequence[dict]) -> list[str]:
    return [f"skipped {s['name']}: {s.get('error', '')}" for s in strategies
            if s["status"] != "ok"]


def sweep_table(cells: Sequence[dict], policies: Sequence[str]) -> Table:
    """Per (proposer, workload, concurrency): tok/s and TPOT p50 per policy, and adaptive's
    throughput relative to the best other policy and to `off`."""
    t = Table(title="specserve bench sweep — output tok/s | TPOT p50 ms")
    for name in ("proposer", "workload", "conc", *policies):
        t.add_column(name, justify="left" if name in ("proposer", "workload") else "right")
    with_ratios = "adaptive" in policies
    if with_ratios:
        t.add_column("adaptive/best", justify="right")
        t.add_column("adaptive/off", justify="right")
    for key, row in group_cells(cells).items():
        proposer, workload, c = key
        values = [f"{_tput(row[p].get('output_tok_s'))} | {fmt(row[p].get('tpot_p50_ms'), 1)}"
                  if p in row else "—" for p in policies]
        extra = []
        if with_ratios:
            r = adaptive_ratios(row)
            # three decimals, as the verdict below: at two a 0.966 against 0.97 reads "0.97"
            extra = ["—" if r[k] is None else f"{r[k]:.3f}" for k in ("vs_best", "vs_off")]
        t.add_row(proposer, workload, str(c), *values, *extra)
    return t


def k_shares(histogram: dict | None) -> str:
    """A chosen-K histogram ({K: request-steps}) as percentages: "0:88 1:4 4:8"."""
    total = sum((histogram or {}).values())
    if not total:
        return "—"
    return " ".join(f"{k}:{100 * v / total:.0f}" for k, v in
                    sorted((int(k), v) for k, v in histogram.items()))


def speculation_table(rows: Sequence[tuple[str, str, int, dict]], title: str) -> Table:
    """What the controller decided and how it went, per (name, workload, concurrency, run):
    the share of request-steps at each K, the cost model's mean predicted step against the
    measured one, and acceptance pooled and spread over the requests that drafted."""
    t = Table(title=title)
    for name in ("strategy", "workload", "conc", "K shares %", "step ms pred/actual",
                 "accept", "per request p10/p50/p90 (n)"):
        t.add_column(name, justify="left" if name in ("strategy", "workload", "K shares %")
                     else "right")
    for name, workload, c, run in rows:
        pred, actual = run.get("spec_step_time_predicted_ms"), run.get("spec_step_time_actual_ms")
        spread = [run.get(f"request_acceptance_p{q}") for q in (10, 50, 90)]
        t.add_row(name, workload, str(c), k_shares(run.get("spec_k_histogram")),
                  f"{pred:.2f}/{actual:.2f}" if pred is not None and actual is not None
                  else "—", fmt(run.get("acceptance_rate"), 2),
                  "/".join(fmt(x, 2) for x in spread) + f" ({run.get('requests_drafted', 0)})"
                  if run.get("requests_drafted") else "—")
    return t


def group_cells(cells: Sequence[dict]) -> dict[tuple, dict[str, dict]]:
    """{(proposer, workload, concurrency): {policy: run figures}} in first-seen order."""
    rows: dict[tuple, dict[str, dict]] = {}
    for cell in cells:
        key = (cell["proposer"], cell["workload"], cell["concurrency"])
        rows.setdefault(key, {})[cell["policy"]] = cell["run"]
    return rows


def adaptive_ratios(row: dict[str, dict]) -> dict:
    """adaptive's throughput over the best other policy's, and over `off`'s.

    When the cells hold every round's throughput (a sweep interleaves the policies round by
    round), each ratio is the median over rounds of adaptive / that policy *within the round*:
    this machine's speed drifts by 10-30% over seconds, and only adjacent runs share a speed.
    The best other policy is then the one adaptive does worst against. Otherwise the ratios
    compare the cells' single figures."""
    tput = {p: r.get("output_tok_s") for p, r in row.items() if r.get("output_tok_s")}
    if "adaptive" not in tput:
        return {"vs_best": None, "vs_off": None, "best_other": None}
    others = [p for p in tput if p != "adaptive"]
    paired = _paired_ratios(row, others)
    ratio = paired or {p: tput["adaptive"] / tput[p] for p in others}
    best = min(others, key=ratio.get, default=None)
    return {"vs_best": ratio[best] if best else None, "vs_off": ratio.get("off"),
            "best_other": best}


def _paired_ratios(row: dict[str, dict], others: Sequence[str]) -> dict[str, float] | None:
    """{policy: median over rounds of adaptive / policy}, or None without 2+ aligned rounds."""
    mine = row["adaptive"].get("output_tok_s_runs") or []
    runs = {p: row[p].get("output_tok_s_runs") or [] for p in others}
    if len(mine) < 2 or any(len(r) != len(mine) for r in runs.values()):
        return None
    ratios = {p: paired_ratio(mine, r) for p, r in runs.items()}
    if any(r is None for r in ratios.values()):
        return None
    return {p: r["median"] for p, r in ratios.items()}


def paired_ratio(mine: Sequence[float], theirs: Sequence[float]) -> dict | None:
    """The median (the lower middle of an even count, bench's one rule) and quartiles over
    rounds of mine / theirs within each round (runs of one round are adjacent in time, so they
    share the machine's speed of the moment). Quartiles by the inclusive method, which stays
    within the ratios measured (the default extrapolates beyond them for few rounds)."""
    ratios = sorted(a / b for a, b in zip(mine, theirs, strict=True) if a and b)
    if not ratios:
        return None
    q1, _, q3 = (statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) >= 2
                 else ratios * 3)
    return {"median": statistics.median_low(ratios), "q1": q1, "q3": q3, "rounds": len(ratios)}


def online_table(rows: Sequence[dict], title: str) -> Table:
    """Per concurrency: the online run, and the in-process one beside it when there is one."""
    t = Table(title=title)
    offline = any(r.get("offline") for r in rows)
    for name in ("conc", "prompts", "out tokens", "tok/s", "TTFT p50/p99 ms", "TPOT p50/p99 ms",
                 *(("offline tok/s", "offline TPOT p50", "online/offline") if offline else ())):
        t.add_column(name, justify="right")
    for r in rows:
        on = r["online"]
        cols = [str(r["concurrency"]), str(on["num_requests"]), str(on["output_tokens"]),
                fmt(on["output_tok_s"], 1),
                f"{fmt(on['ttft_p50_ms'], 0)}/{fmt(on['ttft_p99_ms'], 0)}",
                f"{fmt(on['tpot_p50_ms'], 1)}/{fmt(on['tpot_p99_ms'], 1)}"]
        off = r.get("offline")
        if offline:
            paired = r.get("online_offline_ratio")
            if paired:
                ratio = f"{paired['median']:.3f}"
                if paired["rounds"] >= 4:
                    ratio += f" [{paired['q1']:.3f}, {paired['q3']:.3f}]"
            else:
                ratio = (f"{on['output_tok_s'] / off['output_tok_s']:.3f}"
                         if off and on["output_tok_s"] and off["output_tok_s"] else "—")
            cols += [fmt(off["output_tok_s"], 1) if off else "—",
                     fmt(off["tpot_p50_ms"], 1) if off else "—", ratio]
        t.add_row(*cols)
    return t
