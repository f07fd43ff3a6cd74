"""`specserve bench lab | sweep | online`: flags, progress bar and output files.

Only argparse is imported at the top: `specserve --help` must stay fast.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import asdict, replace
from pathlib import Path

from specserve.server.cli import positive_int  # argparse and os only: --help stays fast


def _ints(text: str) -> tuple[int, ...]:
    """Positive integers, comma-separated (concurrency levels)."""
    values = tuple(int(x) for x in text.split(",") if x.strip())
    if not values or min(values) < 1:
        raise ValueError(f"expected positive integers like 1,8,32, got {text!r}")
    return values


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _common_engine_args(p: argparse.ArgumentParser) -> None:
    """The flags every lab/sweep engine shares (each strategy adds its own on top)."""
    from specserve.cli import parse_memory

    p.add_argument("model", nargs="?", default=None,
                   help="a local Hugging Face directory or .gguf file (default: the embedded "
                        "SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="auto", help="auto | bfloat16 | float32 | float16")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--kv-cache-memory", type=parse_memory, default=1 << 30,
                   help="each target's KV pool (default 1GiB; rag at concurrency 32 without "
                        "prefix caching needs about 2GiB to avoid preemption)")
    p.add_argument("--num-threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--draft-model", default=None,
                   help="a trained draft model directory instead of the 4-layer self-draft")
    p.add_argument("--ignore-eos", action="store_true",
                   help="generate exactly max_tokens per request")


def _common_kwargs(args: argparse.Namespace) -> dict:
    return {"dtype": args.dtype, "device": args.device, "kv_cache_memory": args.kv_cache_memory,
            "num_threads": args.num_threads, "seed": args.seed}


def _out_dir(args: argparse.Namespace, kind: str) -> Path:
    out = Path(args.out or f"bench-results/{kind}-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _console():
    """Rich's console; wide when the output is a file or a pipe (rich would default to 80
    columns there and squeeze the tables)."""
    import sys

    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=200)


def _progress():
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn("{task.description:<42}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TimeRemainingColumn())


def _callback(progress, task):
    def advance(desc: str, n: int) -> None:
        progress.update(task, description=desc, advance=n)

    return advance


# ---- lab ----------------------------------------------------------------------------------------
def cmd_lab(args: argparse.Namespace) -> None:
    from specserve.bench import baselines
    from specserve.bench.lab import (
        PRESETS,
        builtin_strategies,
        estimate_seconds,
        run_lab,
        with_overrides,
    )
    from specserve.bench.machine import describe_machine
    from specserve.bench.plots import lab_plots
    from specserve.bench.report import (
        add_summaries,
        lab_table,
        skipped_lines,
        speculation_table,
        write_json,
    )
    from specserve.bench.sweep import median_run
    from specserve.config import parse_dtype

    preset = with_overrides(
        PRESETS["quick" if args.quick else "full"],
        workloads=_names(args.workloads) if args.workloads else None,
        concurrency=_ints(args.concurrency) if args.concurrency else None,
        repeats=args.repeats, num_prompts_override=args.num_prompts,
        max_tokens_cap=args.max_tokens, ignore_eos=args.ignore_eos or None)
    asked = _names(args.strategies) if args.strategies else None
    minutes = args.train_minutes if args.train_minutes is not None else (
        0.0 if args.quick else 5.0)
    draft_model, eagle_model = args.draft_model, args.eagle_model
    if draft_model is None and (asked is None or any("draft" in n for n in asked)):
        draft_model = _trained(args.model, "draft", minutes, args.num_threads)
    if eagle_model is None and (asked is None or any("eagle" in n for n in asked)):
        eagle_model = _trained(args.model, "eagle", minutes, args.num_threads)
    known = builtin_strategies(draft_model, eagle_model=eagle_model)
    names = asked or tuple(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown strategies {unknown}; known: {', '.join(known)}")
    strategies = [known[n] for n in names]
    common = _common_kwargs(args)
    out = _out_dir(args, "lab")
    console = _console()
    preset = _unseen(preset, args.prompts, console, [
        (draft_model, any("draft" in s.name for s in strategies)),
        (eagle_model, any("eagle" in s.name for s in strategies))])
    console.print(f"preset {preset.name}: {', '.join(preset.workloads)} at concurrency "
                  f"{', '.join(map(str, preset.concurrency))}, {len(strategies)} strategies; "
                  f"estimated at most {estimate_seconds(preset, strategies) / 60:.1f} min "
                  "on 2 cores")
    total = len(strategies) * len(preset.workloads) * len(preset.concurrency) * preset.repeats
    if args.compare_hf:
        total += baselines.num_baseline_points(preset)
    # Described before the run: its commit is the code that runs (a checkout edited during a
    # long run would otherwise stamp the results with the edits).
    machine = describe_machine(dtype=args.dtype, seed=args.seed, repeats=preset.repeats,
                               preset=preset.name, num_threads=args.num_threads,
                               kv_cache_memory=args.kv_cache_memory)
    with _progress() as progress:
        advance = _callback(progress, progress.add_task("lab", total=total))
        lab = run_lab(strategies, preset, common, args.model, advance)
        if args.compare_hf:
            # On the engines' device, and "auto" resolved for it, as the engines' dtype was.
            baselines.run_baselines(lab, preset, args.model,
                                    parse_dtype(args.dtype, args.device), args.num_threads,
                                    args.seed, advance, device=args.device)
    results = {
        "machine": machine,
        "preset": asdict(preset),
        "strategies": lab.strategies,
        "points": add_summaries(lab.points),
    }
    write_json(out / "results.json", results)
    for line in skipped_lines(lab.strategies):  # before the plots, whatever they do
        console.print(line, style="yellow")
    pngs = lab_plots(results, out)
    console.print(lab_table(results))
    spec_rows = [(p["strategy"], p["workload"], p["concurrency"], median_run(p["runs"]))
                 for p in results["points"] if p["runs"] and any(
                     r.get("num_draft_tokens") for r in p["runs"])]
    if spec_rows:
        console.print(speculation_table(spec_rows, "speculation (median run of each point)"))
    console.print(f"wrote {out / 'results.json'}" + (f" and {', '.join(p.name for p in pngs)}"
                                                     if pngs else ""))


def _trained(model: str | None, method: str, minutes: float, num_threads) -> str | None:
    from specserve.bench.trained import cached_path, trained_draft

    path = trained_draft(model, method, minutes, num_threads)
    if path is None:
        print(f"no trained {method} draft in {cached_path(model, method)} and no training "
              f"budget (--train-minutes): " + ("the draft rows use the untrained 4-layer "
                                               "self-draft" if method == "draft" else
                                               "no eagle rows"))
    return None if path is None else str(path)


def _unseen(preset, prompts: str, console, drafts: list[tuple[str | None, bool]]):
    """With --prompts unseen, every workload runs only the prompts the trained drafts in use
    were not trained on (bench/trained.py says why)."""
    used = tuple(path for path, in_use in drafts if path and in_use)
    if prompts == "all" or not used:
        return preset
    preset = replace(preset, unseen_by=used)
    counts = ", ".join(f"{w} {len(preset.items(w))}" for w in preset.workloads)
    console.print(f"trained drafts in use: each workload runs the prompts they were not trained "
                  f"on ({counts}; --prompts all runs every prompt)")
    return preset


def _add_prompts_flag(p) -> None:
    p.add_argument("--prompts", choices=("unseen", "all"), default="unseen",
                   help="unseen (default): where a trained draft runs, only the workload prompts "
                        "it was not trained on (its held-out split); all: every prompt")


def _add_lab(bench) -> None:
    p = bench.add_parser("lab", help="the article's strategy table: strategies x workloads x "
                                     "concurrency, each strategy in a fresh process, with JSON "
                                     "and PNGs")
    _common_engine_args(p)
    p.add_argument("--quick", action="store_true",
                   help="prose, json, sql at concurrency 1 and 16, outputs capped at 48 tokens "
                        "(see the README for its measured time)")
    p.add_argument("--workloads", default=None, help="comma-separated (default: the preset's)")
    p.add_argument("--strategies", default=None,
                   help="comma-separated: vanilla, draft-static, ngram-static, adaptive-ngram, "
                        "adaptive-suffix, adaptive-draft, adaptive-draft-int4 (with a trained "
                        "draft), eagle-static, adaptive-eagle (with a trained head), "
                        "cache+quant (default: all)")
    p.add_argument("--concurrency", default=None, help="e.g. 1,32 (default: the preset's)")
    p.add_argument("--repeats", type=positive_int, default=None,
                   help="repetitions: each builds every strategy again in a fresh process, in "
                        "a rotated order; figures become median [min-max] (of an even count "
                        "the lower middle)")
    p.add_argument("--num-prompts", type=positive_int, default=None,
                   help="prompts per point (default: max(2 x concurrency, 8), with --quick "
                        "min(max(concurrency, 8), 16); never fewer than the concurrency)")
    p.add_argument("--max-tokens", type=positive_int, default=None,
                   help="cap each item's max_tokens")
    p.add_argument("--compare-hf", action="store_true",
                   help="add Hugging Face generate (static batching, and prompt lookup at "
                        "concurrency 1) and llama-cpp-python (if installed) rows")
    p.add_argument("--eagle-model", default=None,
                   help="a trained EAGLE head directory (default: the cached one, if any)")
    p.add_argument("--train-minutes", type=float, default=None,
                   help="when no trained draft / EAGLE head is cached, or the cached one was "
                        "trained for fewer minutes or with an older recipe, train each for this "
                        "many minutes first (default 5 for the full preset, 0 for --quick: use "
                        "whatever is cached)")
    _add_prompts_flag(p)
    p.add_argument("--out", default=None, help="output directory (default: bench-results/lab-*)")
    p.set_defaults(func=cmd_lab)


# ---- sweep --------------------------------------------------------------------------------------
def cmd_sweep(args: argparse.Namespace) -> None:
    from specserve.bench.lab import Preset
    from specserve.bench.machine import describe_machine
    from specserve.bench.plots import sweep_plots
    from specserve.bench.report import speculation_table, sweep_table, write_json
    from specserve.bench.sweep import SweepSettings, run_sweep, summarize_sweep, summary_lines

    points = Preset("sweep", _names(args.workloads), _ints(args.concurrency),
                    prompts_factor=args.num_prompts_factor, min_prompts=args.min_prompts,
                    max_tokens_cap=args.max_tokens, ignore_eos=args.ignore_eos,
                    repeats=args.repeats)
    proposers = _names(args.proposers)
    eagle_model = args.eagle_model
    if eagle_model is None and "eagle" in proposers:
        eagle_model = _trained(args.model, "eagle", 0.0, args.num_threads)
    out = _out_dir(args, "sweep")
    console = _console()
    points = _unseen(points, args.prompts, console, [
        (args.draft_model, "draft" in proposers),  # draft:N is the untrained self-draft
        (eagle_model, "eagle" in proposers)])
    settings = SweepSettings(proposers, _names(args.policies), points, args.k_max,
                             args.draft_model, not args.no_prefix_caching, eagle_model)
    total = (len(settings.proposers) * len(settings.policies) * len(points.workloads)
             * len(points.concurrency))
    machine = describe_machine(dtype=args.dtype, seed=args.seed, repeats=args.repeats,
                               preset="sweep", num_threads=args.num_threads,
                               kv_cache_memory=args.kv_cache_memory)  # the code that runs
    with _progress() as progress:
        advance = _callback(progress, progress.add_task("sweep", total=total))
        cells, engines = run_sweep(settings, _common_kwargs(args), args.model, advance)
    summary = summarize_sweep(cells)
    write_json(out / "sweep.json", {
        "machine": machine,
        "settings": asdict(settings), "engines": engines, "cells": cells, "summary": summary})
    pngs = sweep_plots(cells, out)
    console.print(sweep_table(cells, settings.policies))
    decisions = [(c["proposer"], c["workload"], c["concurrency"], c["run"]) for c in cells
                 if c["policy"] == "adaptive"]
    if decisions:
        console.print(speculation_table(decisions,
                                        "adaptive's decisions (median run of each point)"))
    for s in (e for e in engines if e["status"] != "ok"):
        console.print(f"skipped {s['proposer']}: {s['error']}", style="yellow")
    for line in summary_lines(summary):
        console.print(line)
    console.print(f"wrote {out / 'sweep.json'} and {len(pngs)} PNGs")


def _add_sweep(bench) -> None:
    p = bench.add_parser("sweep", help="concurrency x workload x policy matrix per proposer: "
                                       "does adaptive pick the best policy everywhere?")
    _common_engine_args(p)
    p.add_argument("--proposers", default="ngram,draft",
                   help="ngram, suffix, draft (--draft-model, else the target's first 4 layers, "
                        "untrained, labelled draft(self-4, untrained); bench lab's cached "
                        "trained draft is not used), draft:N (N layers, untrained), eagle "
                        "(--eagle-model, or the head bench lab trained and cached)")
    p.add_argument("--eagle-model", default=None,
                   help="a trained EAGLE head directory (default: the cached one, if any)")
    p.add_argument("--workloads", default="prose,json,rag")
    p.add_argument("--policies", default="off,static:2,static:4,batch-threshold:8,adaptive")
    p.add_argument("--concurrency", default="1,2,4,8,16,32,64")
    p.add_argument("--num-prompts-factor", type=positive_int, default=3,
                   help="prompts per run: max(factor x concurrency, --min-prompts); 3 waves by "
                        "default, so that a run is mostly steady state")
    p.add_argument("--min-prompts", type=positive_int, default=8)
    p.add_argument("--max-tokens", type=positive_int, default=32,
                   help="cap each item's max_tokens")
    p.add_argument("--repeats", type=positive_int, default=3,
                   help="rounds per point, policies interleaved; cells report the median run "
                        "(of an even count the lower middle)")
    p.add_argument("--k-max", type=positive_int, default=4,
                   help="K_max of the policies without their own K (all but static:K)")
    p.add_argument("--no-prefix-caching", action="store_true")
    _add_prompts_flag(p)
    p.add_argument("--out", default=None, help="output directory (default: bench-results/sweep-*)")
    p.set_defaults(func=cmd_sweep)


# ---- online -------------------------------------------------------------------------------------
def cmd_online(args: argparse.Namespace) -> None:
    from specserve.bench.lab import at_least_concurrency, run_workload, warm_up
    from specserve.bench.machine import describe_machine
    from specserve.bench.online import (
        CLIENT_ERRORS,
        OnlineError,
        offline_workload,
        run_client,
        run_online_point,
        warm_up_offline,
    )
    from specserve.bench.report import online_table, paired_ratio, write_json
    from specserve.bench.sweep import median_run
    from specserve.bench.workloads import load_workload

    items = load_workload(args.workload)
    conc = _ints(args.concurrency)
    console = _console()
    console.print(f"online: {args.url} · {args.workload} · concurrency "
                  f"{', '.join(map(str, conc))} · {args.repeats} run(s) each")
    offline = offline_params = None
    if args.compare_offline:  # loaded first: its runs interleave with the online ones
        from specserve.cli import make_llm

        spec = args.speculative_config
        if isinstance(spec, dict) and spec.get("method") == "suffix":
            raise SystemExit("--compare-offline with suffix decoding compares different work: "
                             "the offline engine never guesses a request from its own "
                             "prompt's earlier replies, a server does (the client repeats "
                             "prompts)")
        llm = make_llm(args)
        warm_up(llm.engine)
        # Sampled as the server samples the same bodies (generation_config.json's defaults and
        # cap), every grammar compiled here, and warmed on the online warm-up's prompt.
        wl = offline_workload(llm.engine, args.workload, items, args.max_tokens)
        warm_up_offline(llm.engine, wl, args.ignore_eos)
        offline_params = asdict(wl.params(0, args.ignore_eos))

        def offline(c: int, n: int) -> dict:
            # The server never empties its prefix cache between points: neither do we.
            return run_workload(llm.engine, wl, c, n, args.ignore_eos, reset_prefix_cache=False)
    rows = []
    try:
        for i, c in enumerate(conc):
            n = at_least_concurrency(args.num_prompts, c) if args.num_prompts else max(2 * c, 8)
            runs: dict[str, list[dict]] = {"online": [], "offline": []}
            # Online and offline alternate, which one goes first swapping every round: this
            # machine's speed drifts by 10-30% over seconds, so only a round's two runs share
            # a speed, and the figure that compares them is the median of per-round ratios.
            for r in range(args.repeats):
                sides = ("online", "offline") if r % 2 == 0 else ("offline", "online")
                for side in sides:
                    if side == "online":
                        runs["online"].append(run_client(run_online_point(
                            args.url, items, c, n, model=args.served_model,
                            api_key=args.api_key, max_tokens_cap=args.max_tokens,
                            ignore_eos=args.ignore_eos, timeout=args.timeout,
                            warm_up=i == 0 and r == 0)))
                    elif offline is not None:
                        runs["offline"].append(offline(c, n))
            row = {"concurrency": c}
            for side, results in runs.items():
                if results:
                    row[side] = median_run(results)
                    row[f"{side}_tok_s_runs"] = row[side]["output_tok_s_runs"]
            if runs["offline"]:
                row["online_offline_ratio"] = paired_ratio(row["online_tok_s_runs"],
                                                           row["offline_tok_s_runs"])
            rows.append(row)
    except (OnlineError, *CLIENT_ERRORS) as exc:  # a message, not a traceback
        raise SystemExit(f"specserve: error: {args.url}: {exc}") from None
    console.print(online_table(rows, f"specserve bench online — {rows[0]['online']['model']}"))
    if args.out:
        path = Path(args.out)
        # Every flag but the key (and the in-process engine's flags), and what the in-process
        # side sampled its first request with.
        settings = {k: v for k, v in vars(args).items() if k != "api_key"
                    and (v is None or isinstance(v, (str, int, float, bool, list, tuple, dict)))}
        write_json(path, {"machine": describe_machine(url=args.url, workload=args.workload),
                          "repeats": args.repeats, "settings": settings,
                          "offline_sampling_params": offline_params, "points": rows})
        console.print(f"wrote {path}")


def _add_online(bench) -> None:
    from specserve.cli import add_engine_args

    p = bench.add_parser("online", help="closed-loop streaming client against any "
                                        "OpenAI-compatible server")
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--workload", default="prose")
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--num-prompts", type=positive_int, default=None,
                   help="per concurrency (default: max(2 x concurrency, 8); never fewer "
                        "than the concurrency)")
    p.add_argument("--max-tokens", type=positive_int, default=None,
                   help="cap each item's max_tokens")
    p.add_argument("--api-key", default=os.environ.get("SPECSERVE_API_KEY"))
    p.add_argument("--model", dest="served_model", default=None,
                   help="the model name to send (default: the first in /v1/models)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="send ignore_eos (a vLLM/llama.cpp/specserve extension)")
    p.add_argument("--timeout", type=float, default=600.0, help="per request, seconds")
    p.add_argument("--out", default=None, help="write the results to this JSON file")
    p.add_argument("--compare-offline", action="store_true",
                   help="also run the same points in-process with the engine flags below, "
                        "each request sampled as a specserve server samples it (the model's "
                        "generation_config.json defaults and max_new_tokens cap)")
    p.add_argument("--repeats", type=positive_int, default=1,
                   help="runs per point (online and offline alternating); the median run "
                        "(of an even count the lower middle) is shown, and with "
                        "--compare-offline the median of per-round ratios "
                        "(many short runs resolve a few %% here: e.g. --repeats 30 "
                        "--num-prompts 16)")
    add_engine_args(p)
    p.set_defaults(func=cmd_online)


def cmd_quant(args: argparse.Namespace) -> None:
    from specserve.bench.machine import describe_machine
    from specserve.bench.quant import QuantSettings, format_quant, run_quant_bench
    from specserve.bench.report import write_json

    settings = QuantSettings(input_len=args.input_len, output_len=args.output_len,
                             num_sequential=args.num_sequential, batch=args.batch,
                             kv_cache_memory=args.kv_cache_memory, ppl_tokens=args.ppl_tokens,
                             num_threads=args.num_threads)
    modes = list(_names(args.modes))
    console = _console()
    with _progress() as progress:
        total = (len(modes) + (0 if args.no_llama_cpp else 1)) * args.repeats
        task = progress.add_task("quant", total=total)
        result = run_quant_bench(modes, settings, _callback(progress, task),
                                 with_llama_cpp=not args.no_llama_cpp, repeats=args.repeats)
    console.print(format_quant(result), highlight=False, markup=False)
    if args.out:
        write_json(Path(args.out), {"machine": describe_machine(), **result})
        console.print(f"wrote {args.out}")


def _add_quant(bench) -> None:
    from specserve.bench.quant import MODES
    from specserve.cli import parse_memory

    p = bench.add_parser("quant", help="weight and KV-cache precisions side by side (memory, "
                                       "perplexity, tok/s at 1 and 32) with llama.cpp at 1")
    p.add_argument("--modes", default=",".join(MODES), help=f"any of {','.join(MODES)}")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--num-sequential", type=positive_int, default=4,
                   help="requests run one after another for the concurrency-1 figure")
    p.add_argument("--batch", type=positive_int, default=32,
                   help="the throughput point's concurrency")
    p.add_argument("--kv-cache-memory", type=parse_memory, default=1 << 30)
    p.add_argument("--ppl-tokens", type=int, default=4096)
    p.add_argument("--num-threads", type=int, default=None)
    p.add_argument("--no-llama-cpp", action="store_true")
    p.add_argument("--repeats", type=positive_int, default=1,
                   help="repetitions (rotated order, each mode in a fresh process); medians")
    p.add_argument("--out", default=None, help="write the results to this JSON file")
    p.set_defaults(func=cmd_quant)


def add_bench_parsers(bench: argparse._SubParsersAction) -> None:
    """Register `bench lab`, `bench sweep`, `bench online` and `bench quant` (called from
    specserve.cli)."""
    _add_lab(bench)
    _add_sweep(bench)
    _add_online(bench)
    _add_quant(bench)
