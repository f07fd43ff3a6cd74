"""`specserve bench lab | sweep | online` end to end on a tiny configuration (a few prompts of
4 tokens, fp32, a small KV pool): the closed loop really keeps `concurrency` requests in flight,
and every figure, JSON field and PNG the commands promise is there."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
import torch
from test_server import MODEL_FLAGS, LiveServer

from specserve.bench.lab import (
    PreparedWorkload,
    Preset,
    Strategy,
    builtin_strategies,
    prepare_workload,
    proposer_config,
    run_lab,
    run_workload,
)
from specserve.bench.report import add_summaries, lab_table, sweep_table
from specserve.bench.sweep import summarize_sweep, summary_lines
from specserve.bench.workloads import WorkloadItem, load_workload
from specserve.cli import main

# conftest set torch's thread count from SPECSERVE_TEST_THREADS; the engines follow it.
THREADS = str(torch.get_num_threads())
TINY_ENGINE = ("--dtype", "float32", "--kv-cache-memory", "32MiB", "--num-threads", THREADS)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RUN_FIELDS = {
    "concurrency", "num_prompts", "num_requests", "prompt_tokens", "output_tokens", "wall_s",
    "output_tok_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms",
    "num_preemptions", "num_draft_tokens", "num_accepted_tokens", "num_verifications",
    "acceptance_rate", "mean_accepted_length", "spec_k_histogram", "spec_k_mean",
    "spec_step_time_rel_error", "spec_step_time_predicted_ms", "spec_step_time_actual_ms",
    "requests_drafted", "request_acceptance_p10", "request_acceptance_p50",
    "request_acceptance_p90", "prefix_cache_hit_rate", "draft_time_s", "verify_time_s",
    "step_time_s", "target_weight_bytes", "target_kv_bytes", "draft_weight_bytes",
    "draft_kv_bytes", "kv_blocks_total", "kv_blocks_peak_used", "max_in_flight", "requests"}
REQUEST_FIELDS = {"prompt_tokens", "output_tokens", "ttft_s", "tpot_s", "start_s", "end_s",
                  "num_draft_tokens", "num_accepted_tokens"}
MACHINE_FIELDS = {"cpu_model", "cpu_cores", "ram_bytes", "torch", "transformers", "git_commit",
                  "date", "dtype", "seed", "repeats", "preset"}


def assert_png(path) -> None:
    assert path.is_file(), path
    assert path.read_bytes()[:8] == PNG_MAGIC, path


def test_closed_loop_replaces_a_finished_request_at_once(llm):
    """Concurrency 2 with a short and a long request: the third request must join while the
    long one still runs (continuous batching), and never more than 2 run at once."""
    items = [WorkloadItem("short", [{"role": "user", "content": "Say hi."}], 2),
             WorkloadItem("long", [{"role": "user", "content": "Count to ten."}], 6)]
    wl = prepare_workload(llm.engine, "custom", items)
    run = run_workload(llm.engine, wl, concurrency=2, num_prompts=4, ignore_eos=True)
    reqs = run["requests"]
    assert run["max_in_flight"] == 2
    assert [r["output_tokens"] for r in reqs] == [2, 6, 2, 6]
    assert reqs[2]["start_s"] < reqs[1]["end_s"]  # joined the running batch, not a new wave
    assert run["output_tokens"] == run["num_generated_tokens"] == 16
    assert all(r["ttft_s"] > 0 and r["tpot_s"] > 0 for r in reqs)
    assert run["output_tok_s"] == pytest.approx(16 / run["wall_s"])
    assert run["ttft_p99_ms"] >= run["ttft_p50_ms"] > 0


def test_a_strategy_the_engine_refuses_is_skipped_not_fatal():
    lab = run_lab([Strategy("broken", {"dtype": "int3"})],
                  Preset("t", ("json",), (1,), num_prompts_override=1, max_tokens_cap=2), {})
    assert lab.strategies == [{"name": "broken", "engine_kwargs": {"dtype": "int3"},
                               "status": "skipped", "error": lab.strategies[0]["error"]}]
    assert "int3" in lab.strategies[0]["error"]
    assert lab.points == []
    table = lab_table({"machine": {}, "strategies": lab.strategies, "points": []})
    assert table.row_count == 1


def test_lab_end_to_end(tmp_path, capsys):
    main(["bench", "lab", "--workloads", "prose,json", "--strategies", "vanilla,ngram-static",
          "--concurrency", "1,2", "--num-prompts", "2", "--max-tokens", "4", *TINY_ENGINE,
          "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert "vanilla" in printed and "ngram-static" in printed and "results.json" in printed
    data = json.loads((tmp_path / "results.json").read_text())
    assert MACHINE_FIELDS <= set(data["machine"])
    assert data["machine"]["dtype"] == "float32"
    assert [s["name"] for s in data["strategies"]] == ["vanilla", "ngram-static"]
    for s in data["strategies"]:
        assert s["status"] == "ok"
        assert s["target_weight_bytes"] > 0 and s["target_kv_bytes"] > 0
        assert s["kv_blocks_total"] > 0
    ngram = data["strategies"][1]["engine_kwargs"]
    assert ngram["speculative_config"]["method"] == "ngram"
    assert ngram["enable_prefix_caching"] is False
    keys = {(p["strategy"], p["workload"], p["concurrency"]) for p in data["points"]}
    assert keys == {(s, w, c) for s in ("vanilla", "ngram-static") for w in ("prose", "json")
                    for c in (1, 2)}
    for p in data["points"]:
        (run,) = p["runs"]
        assert RUN_FIELDS <= set(run), RUN_FIELDS - set(run)
        assert run["num_requests"] == 2 and run["max_in_flight"] == p["concurrency"]
        assert 2 <= run["output_tokens"] <= 8 and run["output_tok_s"] > 0
        assert len(run["requests"]) == 2
        assert all(REQUEST_FIELDS <= set(r) for r in run["requests"])
        assert p["summary"]["output_tok_s"]["median"] == run["output_tok_s"]
        if p["strategy"] == "vanilla":
            assert run["num_draft_tokens"] == 0 and run["acceptance_rate"] is None
        assert run["cost_model_ms"] is None  # neither policy prices anything
    # The speculative row really speculated (a lab that dropped its config would measure
    # vanilla twice), and its per-request spread is recorded and printed.
    spec_runs = [p["runs"][0] for p in data["points"] if p["strategy"] == "ngram-static"]
    assert sum(r["num_draft_tokens"] for r in spec_runs) > 0
    assert sum(r["requests_drafted"] for r in spec_runs) > 0
    assert "speculation (median run of each point)" in printed
    for name in ("throughput_vs_concurrency", "tpot_vs_concurrency", "acceptance_by_workload",
                 "memory_breakdown"):
        assert_png(tmp_path / f"{name}.png")


def test_every_strategy_runs_a_full_batch_before_its_first_timed_point(monkeypatch):
    # Only adaptive engines (their start-up profile) ran large forwards before the clock
    # started; vanilla's first full batch fell inside its first timed point.
    import specserve.bench.lab as lab_mod

    calls = []
    real = lab_mod.run_workload

    def spy(engine, workload, concurrency, num_prompts, *args, **kwargs):
        calls.append((concurrency, num_prompts, max(workload.max_tokens)))
        return real(engine, workload, concurrency, num_prompts, *args, **kwargs)

    monkeypatch.setattr(lab_mod, "run_workload", spy)
    preset = Preset("t", ("sql", "prose"), (1, 3), num_prompts_override=3, max_tokens_cap=12)
    lab = run_lab([Strategy("vanilla", {})], preset, {"kv_cache_memory": 64 << 20},
                  isolate=False)
    assert lab.strategies[0]["status"] == "ok"
    # The untimed batch: 3 requests at once, 8 tokens each, on prose (sql's prompts hold a
    # schema: longer).
    assert calls[0] == (3, 3, 8) and len(calls) == 1 + 4
    assert [p["concurrency"] for p in lab.points] == [1, 3, 1, 3]


def test_runs_record_the_adaptive_policys_prices():
    """What the controller believed a forward costs, per run: a start-up profile taken in a
    slow spell shows there."""
    from specserve.bench.lab import _prices
    from specserve.spec_decode.cost_model import StepCostModel
    from specserve.spec_decode.policy import AdaptivePolicy

    target = StepCostModel([1, 16, 64], [0.010, 0.012, 0.030])
    draft = StepCostModel([1, 64], [0.001, 0.002])
    prices = _prices(AdaptivePolicy(4, target, draft))
    assert prices["target"][1] == 10.0 and prices["target"][16] == 12.0
    assert prices["target"][64] == 30.0 and prices["draft"][1] == 1.0
    target.scale = 1.5  # the online correction is part of the price
    scaled = _prices(AdaptivePolicy(4, target, None))
    assert scaled["draft"] is None
    assert scaled["target"] == pytest.approx({n: v * 1.5 for n, v in prices["target"].items()},
                                             abs=2e-3)
    assert _prices(None) is None


def test_repeats_report_median_and_spread():
    runs = [{"output_tok_s": v, "spec_k_histogram": {4: 1}, "acceptance_rate": None}
            for v in (10.0, 30.0, 20.0)]
    (point,) = add_summaries([{"strategy": "s", "workload": "w", "concurrency": 1,
                               "runs": runs}])
    assert point["summary"]["output_tok_s"] == {"median": 20.0, "min": 10.0, "max": 30.0}
    assert point["summary"]["spec_k_histogram"] == {4: 3}
    assert point["summary"]["acceptance_rate"] is None


def test_sweep_end_to_end(tmp_path, capsys):
    main(["bench", "sweep", "--proposers", "ngram", "--policies", "off,static:2",
          "--workloads", "json", "--concurrency", "1,2", "--min-prompts", "2", "--repeats", "2",
          "--num-prompts-factor", "1", "--max-tokens", "4", *TINY_ENGINE, "--out", str(tmp_path)])
    assert "static:2" in capsys.readouterr().out
    data = json.loads((tmp_path / "sweep.json").read_text())
    # One engine per proposer: every policy runs on that instance.
    assert [(e["proposer"], e["policies"], e["status"]) for e in data["engines"]] == [
        ("ngram", ["off", "static:2"], "ok")]
    cells = {(c["policy"], c["concurrency"]): c["run"] for c in data["cells"]}
    assert set(cells) == {(p, c) for p in ("off", "static:2") for c in (1, 2)}
    for (policy, c), run in cells.items():
        assert run["num_requests"] == 2 and run["max_in_flight"] == c
        assert run["output_tok_s"] > 0 and run["tpot_p50_ms"] > 0
        assert len(run["output_tok_s_runs"]) == 2  # both rounds, the median run's figures
        assert run["output_tok_s"] in run["output_tok_s_runs"]
        if policy == "off":
            assert run["num_draft_tokens"] == 0
        else:
            assert set(run["spec_k_histogram"]) <= {"0", "1", "2"}  # capped by max_tokens
    assert sum(run["num_draft_tokens"] for (policy, _), run in cells.items()
               if policy == "static:2") > 0
    assert data["summary"]["ratios"] == []  # no adaptive policy in this sweep
    assert_png(tmp_path / "sweep_ngram_json.png")


def test_a_sweep_without_a_trained_head_skips_the_eagle_proposer(tmp_path, monkeypatch):
    """No head passed and none cached: the eagle engine is skipped with the reason, the
    others run."""
    monkeypatch.setenv("SPECSERVE_CACHE", str(tmp_path / "cache"))
    main(["bench", "sweep", "--proposers", "eagle,ngram", "--policies", "off",
          "--workloads", "json", "--concurrency", "1", "--min-prompts", "1", "--repeats", "1",
          "--max-tokens", "2", *TINY_ENGINE, "--out", str(tmp_path / "out")])
    engines = json.loads((tmp_path / "out" / "sweep.json").read_text())["engines"]
    assert [(e["proposer"], e["status"]) for e in engines] == [("eagle", "skipped"),
                                                                ("ngram", "ok")]
    assert "needs a trained head" in engines[0]["error"]


def test_a_warm_shared_prefix_is_cached_before_the_clock_starts(llm):
    engine = llm.engine
    doc = list(range(100, 100 + 4 * engine.block_manager.block_size))
    workload = PreparedWorkload("w", [doc + [7, 8], doc + [9]], [3, 3])
    assert workload.shared_prefix == doc
    run = run_workload(engine, workload, 2, 2, warm_shared_prefix=True)
    # Both requests find the whole document cached: only their own tails are computed.
    assert run["prefix_cache_hits"] == 2 * len(doc)


def test_a_warm_shared_prefix_is_in_the_draft_models_cache_too():
    from specserve import LLM

    spec = LLM(dtype="float32", speculation_policy="static", speculative_config={
        "method": "draft", "draft_layers": 2, "num_speculative_tokens": 2})
    doc = list(range(100, 100 + 4 * spec.engine.block_manager.block_size))
    workload = PreparedWorkload("w", [doc + [7, 8], doc + [9]], [3, 3])
    run = run_workload(spec.engine, workload, 2, 2, warm_shared_prefix=True)
    assert run["prefix_cache_hits"] == run["draft_prefix_cache_hits"] == 2 * len(doc)


def test_sweep_summary_flags_where_adaptive_loses():
    def cell(policy: str, c: int, tput: float) -> dict:
        return {"proposer": "ngram", "workload": "json", "policy": policy, "concurrency": c,
                "run": {"output_tok_s": tput, "tpot_p50_ms": 1000 / tput}}

    cells = [cell("off", 1, 100), cell("static:4", 1, 150), cell("adaptive", 1, 148),
             cell("off", 32, 900), cell("static:4", 32, 700), cell("adaptive", 32, 850)]
    summary = summarize_sweep(cells)
    assert [r["concurrency"] for r in summary["ratios"]] == [1, 32]
    assert summary["ratios"][0]["vs_best"] == pytest.approx(148 / 150)
    assert summary["ratios"][0]["vs_off"] == pytest.approx(1.48)
    (below_best,) = summary["adaptive_below_best"]  # 850 < 0.97 x 900
    assert (below_best["concurrency"], below_best["best_other"]) == (32, "off")
    assert [p["concurrency"] for p in summary["adaptive_below_off"]] == [32]
    lines = summary_lines(summary)
    assert "1 point(s): ngram/json/c=32 (0.944x off)" in lines[0]
    assert sweep_table(cells, ["off", "static:4", "adaptive"]).row_count == 2


def test_sweep_summary_reports_the_controllers_cost_where_it_drafted_nothing():
    def cell(policy: str, c: int, drafts: int, spec_s: float) -> dict:
        return {"proposer": "ngram", "workload": "prose", "policy": policy, "concurrency": c,
                "run": {"output_tok_s": 100.0, "num_draft_tokens": drafts,
                        "step_time_s": 2.0, "spec_time_s": spec_s}}

    cells = [cell("off", 1, 0, 0.0), cell("adaptive", 1, 40, 0.5),
             cell("off", 64, 0, 0.0), cell("adaptive", 64, 0, 0.01)]
    summary = summarize_sweep(cells)
    assert [(p["drafted"], p["spec_time_frac"]) for p in summary["ratios"]] == [
        (True, 0.25), (False, 0.005)]
    # Only the point where it drafted nothing measures the cost of deciding not to.
    assert "drafted nothing at 1 point(s)" in summary_lines(summary)[-1]
    assert "0.50% of the step time" in summary_lines(summary)[-1]


def test_sweep_ratios_pair_the_runs_of_each_round():
    """With every round's throughput, adaptive is compared with each policy inside a round
    (the machine's speed drifts between rounds), not median run against median run."""
    def cell(policy: str, runs: list[float]) -> dict:
        return {"proposer": "ngram", "workload": "json", "policy": policy, "concurrency": 8,
                "run": {"output_tok_s": sorted(runs)[1], "output_tok_s_runs": runs}}

    # Round 2 ran slow for adaptive and fast for off, round 3 the other way round.
    cells = [cell("off", [98, 82, 49]), cell("static:2", [90, 45, 70]),
             cell("adaptive", [100, 50, 80])]
    (ratios,) = summarize_sweep(cells)["ratios"]
    assert ratios["vs_off"] == pytest.approx(100 / 98)  # median of 100/98, 50/82, 80/49
    assert (ratios["rounds_below_off"], ratios["rounds"]) == (1, 3)
    assert ratios["vs_best"] == pytest.approx(100 / 98) and ratios["best_other"] == "off"
    # Median run against median run would have read 80 / 82.
    assert ratios["vs_off"] > 1 > 80 / 82
    # A loss says in how many rounds adaptive was the slower.
    cells = [cell("off", [100, 100, 100]), cell("adaptive", [99, 98, 101])]
    assert "(0.990x, below in 2 of 3 rounds)" in summary_lines(summarize_sweep(cells))[1]


@pytest.fixture(scope="module")
def server():
    live = LiveServer(*MODEL_FLAGS)
    yield live
    live.stop()


def test_online_against_a_live_server(server, tmp_path, capsys):
    before = server.stats()["num_generated_tokens"]
    out = tmp_path / "online.json"
    main(["bench", "online", "--url", server.url, "--workload", "json", "--concurrency", "2",
          "--num-prompts", "4", "--max-tokens", "4", "--ignore-eos", "--out", str(out),
          "--compare-offline", "--repeats", "2", *TINY_ENGINE])
    assert "online/offline" in capsys.readouterr().out
    data = json.loads(out.read_text())
    (point,) = data["points"]
    # The JSON says what ran: the client's flags and the in-process side's sampling.
    assert data["settings"]["max_tokens"] == 4 and data["settings"]["ignore_eos"] is True
    assert data["settings"]["num_prompts"] == 4 and "api_key" not in data["settings"]
    assert data["offline_sampling_params"]["ignore_eos"] is True
    # Two runs a side, alternating; the median (lower middle) run of each is the one shown.
    assert len(point["online_tok_s_runs"]) == len(point["offline_tok_s_runs"]) == 2
    assert point["online"]["output_tok_s"] == min(point["online_tok_s_runs"])
    # The comparison pairs each round's runs: the median (lower middle) of the two per-round
    # ratios, bench's one median rule.
    ratios = [a / b for a, b in zip(point["online_tok_s_runs"], point["offline_tok_s_runs"],
                                    strict=True)]
    assert point["online_offline_ratio"]["median"] == pytest.approx(min(ratios))
    assert point["online_offline_ratio"]["rounds"] == 2
    online, offline = point["online"], point["offline"]
    assert online["num_requests"] == 4 and online["model"] == "SmolLM2-135M-Instruct"
    # Exact counts from the usage chunk: 4 tokens each, whatever the chunking.
    assert [r["output_tokens"] for r in online["requests"]] == [4, 4, 4, 4]
    assert all(r["prompt_tokens"] > 0 for r in online["requests"])
    # The server generated exactly those, twice, plus the 4 of the warm-up request.
    assert server.stats()["num_generated_tokens"] - before == 2 * 16 + 4
    assert online["output_tok_s"] == pytest.approx(16 / online["wall_s"])
    assert 0 < online["ttft_p50_ms"] <= online["ttft_p99_ms"] < 60_000
    assert 0 < online["tpot_p50_ms"] <= online["tpot_p99_ms"] < 60_000
    assert offline["output_tokens"] == 16 and offline["max_in_flight"] == 2
    assert [r["prompt_tokens"] for r in offline["requests"]] == \
        [r["prompt_tokens"] for r in online["requests"]]


def test_online_reports_server_errors(server):
    from specserve.bench.online import OnlineError, run_online_point

    items = [WorkloadItem("x", [{"role": "user", "content": "hi"}], 2)]
    with pytest.raises(OnlineError, match="404"):
        asyncio.run(run_online_point(server.url, items, 1, 1, model="no-such-model"))
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_prepared_workload_cycles_through_items():
    wl = PreparedWorkload("w", [[1], [2], [3]], [5, 6, 7])
    assert wl.take(4) == [([1], 5), ([2], 6), ([3], 7), ([1], 5)]
    assert wl.params(4).max_tokens == 6 and wl.params(4).structured_outputs is None


def test_the_json_schema_workload_runs_under_its_schemas(llm):
    """Its requests carry their schemas into the closed loop, where the forced keys are
    drafted (vanilla, which speculates in no way, turns that off)."""
    items = load_workload("json-schema")[:2]
    workload = prepare_workload(llm.engine, "json-schema", items, cap=24)
    assert workload.params(3).structured_outputs.json == items[1].structured_outputs["json"]
    run = run_workload(llm.engine, workload, 2, 2)
    assert run["num_jump_forward_accepted"] > 0
    assert builtin_strategies()["vanilla"].engine_kwargs["jump_forward_tokens"] == 0


def test_the_lab_has_every_free_proposer():
    """Prompt lookup and suffix decoding need no trained network: both are lab rows by default."""
    methods = {s.engine_kwargs.get("speculative_config", {}).get("method")
               for s in builtin_strategies().values()}
    assert {"ngram", "suffix"} <= methods


def test_an_untrained_self_draft_is_named_so_in_the_lab():
    """Without a trained draft the draft rows are the target's first 4 layers: their results
    carry that in their name (the --strategies keys stay)."""
    assert builtin_strategies()["adaptive-draft"].name == "adaptive-draft (self-4, untrained)"
    assert builtin_strategies("/trained")["adaptive-draft"].name == "adaptive-draft"


def test_lab_finds_cached_drafts_and_trains_only_with_a_budget(tmp_path, monkeypatch, caplog):
    from specserve.bench.trained import cached_path, trained_draft
    from specserve.train.pipeline import RECIPE

    monkeypatch.setenv("SPECSERVE_CACHE", str(tmp_path))
    for method in ("draft", "eagle"):
        path = cached_path(None, method)
        assert path.is_relative_to(tmp_path)
        assert trained_draft(None, method, minutes=0) is None  # nothing cached, no budget
        path.mkdir(parents=True)
        (path / "training.json").write_text(json.dumps({"recipe": RECIPE[method]}))
        caplog.clear()
        assert trained_draft(None, method, minutes=0) == path
        assert "older recipe" not in caplog.text
        (path / "training.json").write_text("{}")  # an older recipe: used, with a warning
        assert trained_draft(None, method, minutes=0) == path
        assert "older recipe" in caplog.text
    assert cached_path(None, "draft") != cached_path(None, "eagle")


def _cached_draft(monkeypatch, target: str | None, **report) -> tuple[Path, list[float]]:
    """A draft cached for target, trained by the current recipe for 2 minutes (plus report's
    fields), and the budgets of the trainings trained_draft then asks for (none is run)."""
    from specserve.bench.trained import cached_path
    from specserve.train import pipeline

    budgets: list[float] = []
    monkeypatch.setattr(pipeline, "train_draft",
                        lambda target, items, path, cfg, **kw: budgets.append(cfg.minutes))
    path = cached_path(target, "draft")
    path.mkdir(parents=True)
    (path / "training.json").write_text(json.dumps(
        {"recipe": pipeline.RECIPE["draft"], "settings": {"minutes": 2.0}, **report}))
    return path, budgets


def test_a_cached_draft_trained_for_less_than_asked_is_trained_again(tmp_path, monkeypatch):
    from specserve.bench.trained import trained_draft

    monkeypatch.setenv("SPECSERVE_CACHE", str(tmp_path))
    path, budgets = _cached_draft(monkeypatch, None)
    assert trained_draft(None, "draft", minutes=2.0) == path and budgets == []
    assert trained_draft(None, "draft", minutes=0) == path and budgets == []
    assert trained_draft(None, "draft", minutes=5.0) == path and budgets == [5.0]


def test_a_cached_draft_for_other_weights_at_the_same_path_is_not_used(tmp_path, monkeypatch,
                                                                        caplog):
    # A checkpoint fine-tuned in place keeps its path, the cache's only key: its old draft
    # failed to load (another embedding) or guessed for weights that are gone.
    from tiny_models import make_tiny_model

    from specserve.bench.trained import trained_draft
    from specserve.train.save import target_fingerprint

    monkeypatch.setenv("SPECSERVE_CACHE", str(tmp_path / "cache"))
    target = str(make_tiny_model(tmp_path / "t", seed=1))
    path, trained = _cached_draft(monkeypatch, target,
                                  target_fingerprint=target_fingerprint(target))
    assert trained_draft(target, "draft", minutes=0) == path
    make_tiny_model(tmp_path / "t", seed=2)  # the same path, other weights
    assert trained_draft(target, "draft", minutes=0) is None
    assert "trained for other weights" in caplog.text and trained == []
    assert trained_draft(target, "draft", minutes=2.0) == path and trained == [2.0]


def _square(x: int, progress) -> tuple[int, int]:
    import os

    progress("squaring", 1)
    return x * x, os.getpid()


def _fail(progress) -> None:
    raise ValueError("boom in the child")


def test_isolated_runs_forward_progress_results_and_errors():
    import os

    from specserve.bench.isolate import run_isolated

    seen = []
    value, pid = run_isolated(_square, (7,), lambda desc, n: seen.append((desc, n)))
    assert value == 49 and pid != os.getpid()
    assert seen == [("squaring", 1)]
    with pytest.raises(RuntimeError, match="ValueError: boom in the child"):
        run_isolated(_fail, (), lambda desc, n: None)


def _report_pid_and_wait(progress) -> None:
    import os
    import time

    progress(str(os.getpid()), 1)
    time.sleep(600)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_a_killed_lab_takes_its_worker_with_it():
    """SIGKILL runs no `finally` in the lab: its worker must notice and exit on its own."""
    import signal
    import subprocess
    import sys
    import time

    script = (
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from test_bench_lab import _report_pid_and_wait\n"
        "from specserve.bench.isolate import run_isolated\n"
        "if __name__ == '__main__':\n"
        "    run_isolated(_report_pid_and_wait, (), lambda d, n: print(d, flush=True))\n"
    )
    lab = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        worker = int(lab.stdout.readline())
        assert _alive(worker)
    finally:
        lab.send_signal(signal.SIGKILL)
        lab.wait()
    deadline = time.monotonic() + 60  # a liveness bound, not a speed check
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(worker)


def test_repetitions_rebuild_every_strategy_in_rotated_order(monkeypatch):
    import specserve.bench.lab as lab_mod
    from specserve.bench.lab import LabRun

    built = []

    def fake(strategy, preset, common, model, progress):
        built.append(strategy.name)
        assert preset.repeats == 1  # one repetition per build
        if strategy.name == "broken":
            return LabRun(strategies=[{"name": "broken", "status": "skipped"}])
        point = {"strategy": strategy.name, "workload": "json", "concurrency": 1,
                 "runs": [{"build": len(built)}]}
        return LabRun(strategies=[{"name": strategy.name, "status": "ok"}], points=[point])

    monkeypatch.setattr(lab_mod, "strategy_lab", fake)
    names = ("a", "b", "broken")
    lab = run_lab([Strategy(n, {}) for n in names],
                  Preset("t", ("json",), (1,), num_prompts_override=1, repeats=3), {},
                  isolate=False)
    # Each repetition starts one strategy later; a skipped strategy is not built again.
    assert built == ["a", "b", "broken", "b", "a", "a", "b"]
    assert [s["name"] for s in lab.strategies] == ["a", "b", "broken"]
    runs = {p["strategy"]: [r["build"] for r in p["runs"]] for p in lab.points}
    assert runs == {"a": [1, 5, 6], "b": [2, 4, 7]}


def test_proposer_config_takes_model_directories_by_name():
    assert proposer_config("draft", 3, draft_model="/d") == {
        "method": "draft", "model": "/d", "num_speculative_tokens": 3}
    assert proposer_config("draft:2", 3)["draft_layers"] == 2
    assert proposer_config("eagle", 3, eagle_model="/e")["model"] == "/e"
    # Positionally, a trained draft's directory landed in the EAGLE slot and the untrained
    # self-draft was measured instead, without a word.
    with pytest.raises(TypeError):
        proposer_config("draft", 3, None, "/d")


def fake_trained_draft(path: Path, source: str, seed: int = 0) -> Path:
    """A draft directory whose report says what train-draft trained it on."""
    path.mkdir(parents=True)
    (path / "training.json").write_text(json.dumps(
        {"source": source, "settings": {"seed": seed, "held_out_fraction": 0.15}}))
    return path


def test_trained_drafts_are_timed_on_the_prompts_they_were_not_trained_on(tmp_path, caplog,
                                                                        monkeypatch):
    """The lab's drafts are trained on the lab's own workloads: their rows must run the prompts
    train-draft held out (the same seeded split), for every strategy of the run alike."""
    from specserve.bench.trained import unseen_items
    from specserve.train.data import split_by_kind, workload_prompts

    draft = fake_trained_draft(tmp_path / "eagle", "workload:prose,json")
    _, held = split_by_kind(workload_prompts("prose,json"), 0.15, 0)
    for name in ("prose", "json"):
        unseen = unseen_items(name, [draft])
        assert [i.messages for i in unseen] == [i.messages for i in load_workload(name)
                                                if i.messages in [p.messages for p in held]]
        assert 0 < len(unseen) < len(load_workload(name)) / 4
    assert unseen_items("sql", [draft]) == load_workload("sql")  # never trained on sql
    other_seed = fake_trained_draft(tmp_path / "seed1", "workload:prose,json", seed=1)
    assert unseen_items("prose", [other_seed]) != unseen_items("prose", [draft])
    assert unseen_items("prose", [tmp_path]) == load_workload("prose")  # no report: untrained
    gone = fake_trained_draft(tmp_path / "gone", f"prompts:{tmp_path / 'missing.jsonl'}")
    assert unseen_items("prose", [gone]) == load_workload("prose")
    assert "cannot tell which prompts" in caplog.text
    broken = fake_trained_draft(tmp_path / "broken", "workload:prose")
    (broken / "training.json").write_text('{"source": "workload:prose", "settings": null}')
    assert unseen_items("prose", [broken]) == load_workload("prose")  # warned, not crashed
    monkeypatch.setenv("HOME", str(tmp_path))  # "~/eagle", as the loaders expand it
    assert unseen_items("prose", ["~/eagle"]) == unseen_items("prose", [draft])
    # A report that lists its train prompts is read by that list, not by its source.
    from specserve.train.data import prompt_key

    listed = fake_trained_draft(tmp_path / "listed", "prompts:/gone.jsonl")
    (listed / "training.json").write_text(json.dumps(
        {"source": "prompts:/gone.jsonl",
         "train_prompt_keys": [prompt_key(i.messages) for i in load_workload("prose")[3:]]}))
    assert unseen_items("prose", [listed]) == load_workload("prose")[:3]
    # The lab prepares each workload once, from those items, for every strategy.
    preset = Preset("t", ("prose",), (1,), num_prompts_override=1, max_tokens_cap=2,
                    unseen_by=(str(draft),))
    lab = run_lab([Strategy("vanilla", {})], preset, {"dtype": "float32",
                                                     "kv_cache_memory": 32 << 20},
                  isolate=False)
    assert len(lab.workloads["prose"].prompts) == len(unseen_items("prose", [draft]))


# ---- review 44: the lab's table, baselines and prompt counts --------------------------------
def _point(strategy: str, c: int, tok_s: float, tpot_ms: float) -> dict:
    return {"strategy": strategy, "workload": "prose", "concurrency": c,
            "runs": [{"output_tok_s": tok_s, "tpot_p50_ms": tpot_ms}]}


def _column(table, i: int) -> tuple[str, list[str]]:
    col = table.columns[i]
    return col.header, list(col.cells)


def add_summaries_again(results: dict) -> dict:
    return {**results, "points": add_summaries(results["points"])}


def test_lab_table_takes_its_columns_from_the_engine_rows_and_divides_per_stream():
    """hf-prompt-lookup adds a point at concurrency 1 whatever the preset: the @lo columns must
    still be the engines' lowest (4 here), and tok/s/stream the aggregate over 4 streams / 4."""
    results = {"machine": {}, "strategies": [
        {"name": "vanilla", "status": "ok", "kv_blocks_total": 10},
        {"name": "hf-prompt-lookup", "status": "ok", "target_weight_bytes": 1 << 20}],
        "points": add_summaries([_point("vanilla", 4, 40.0, 25.0),
                                 _point("vanilla", 8, 64.0, 30.0),
                                 _point("hf-prompt-lookup", 1, 9.0, 100.0)])}
    table = lab_table(results)
    assert _column(table, 2) == ("TPOT p50 ms @4", ["25.0", "—"])
    assert _column(table, 3) == ("tok/s/stream @4", ["10.0", "—"])
    assert _column(table, 4) == ("tok/s @8", ["64.0", "—"])
    assert _column(table, 6) == ("prefix hit % @8", ["—", "—"])  # no prefix caching
    results["points"][1]["runs"][0]["prefix_cache_hit_rate"] = 0.625  # repeats hit the cache
    assert _column(lab_table(add_summaries_again(results)), 6)[1] == ["62", "—"]
    # No engine row (every strategy skipped): the baselines' own concurrencies.
    results["strategies"] = results["strategies"][1:]
    assert _column(lab_table(results), 3) == ("tok/s/stream @1", ["9.0"])


def test_the_memory_plot_leaves_out_rows_without_measured_memory():
    from specserve.bench.plots import memory_rows

    rows = [{"name": "vanilla", "status": "ok", "target_weight_bytes": 5, "target_kv_bytes": 7},
            {"name": "hf-generate", "status": "ok", "target_weight_bytes": 5},
            {"name": "llama.cpp", "status": "ok"},
            {"name": "broken", "status": "skipped"}]
    assert [r["name"] for r in memory_rows(rows)] == ["vanilla"]


def test_fewer_prompts_than_the_concurrency_are_raised_to_it_with_a_warning(caplog):
    from specserve.bench.lab import at_least_concurrency

    preset = Preset("t", ("prose",), (1, 32), num_prompts_override=7)
    caplog.clear()
    assert preset.num_prompts(32) == 32  # a point labelled @32 really had 32 in flight
    assert "7 prompts cannot keep 32 requests in flight" in caplog.text
    assert preset.num_prompts(1) == 7
    assert at_least_concurrency(40, 32) == 40
    assert Preset("t", ("prose",), (16,)).num_prompts(16) == 32  # the default is unchanged
    # Without max_prompts too (bench sweep's --min-prompts 4 once ran 4 requests "at 64").
    assert Preset("s", ("prose",), (64,), prompts_factor=0, min_prompts=4).num_prompts(64) == 64


@pytest.mark.parametrize("argv", [
    ["bench", "sweep", "--repeats", "0"], ["bench", "sweep", "--num-prompts-factor", "0"],
    ["bench", "quant", "--num-sequential", "0"], ["bench", "lab", "--num-prompts", "0"]])
def test_counts_below_one_are_refused_by_the_parser(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and "at least 1" in capsys.readouterr().err


def test_a_concurrency_below_one_is_refused():
    from specserve.bench.cli import _ints

    assert _ints("1, 8,32") == (1, 8, 32)
    with pytest.raises(ValueError, match="positive integers"):
        _ints("0,8")


def test_a_lab_whose_strategies_were_all_skipped_draws_nothing(tmp_path):
    from specserve.bench.plots import lab_plots

    results = {"points": [], "strategies": [{"name": "x", "status": "skipped"}]}
    assert lab_plots(results, tmp_path) == []


def test_online_refuses_zero_repeats(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "online", "--repeats", "0"])
    assert exc.value.code == 2 and "at least 1" in capsys.readouterr().err


class FakeLlama:
    """llama-cpp-python's Llama as the baselines use it: every stream ends with a chunk of no
    text whose finish_reason is set."""

    def __init__(self, chunks: int = 3):
        self.chunks = chunks
        self.calls: list[tuple[bool, int]] = []

    def reset(self) -> None:
        pass

    def token_eos(self) -> int:
        return 1

    def create_completion(self, prompt, max_tokens, temperature, stream=False, **kw):
        self.calls.append((stream, max_tokens))
        if not stream:
            return {"choices": [{"text": "a" * self.chunks, "finish_reason": "length"}]}
        return self._stream()

    def _stream(self):
        for _ in range(self.chunks):
            yield {"choices": [{"text": "a", "finish_reason": None}]}
        yield {"choices": [{"text": "", "finish_reason": "length"}]}


def test_llama_cpps_final_empty_chunk_is_not_a_token():
    from specserve.bench.baselines import run_llama_cpp, token_chunk_times

    assert len(token_chunk_times(FakeLlama(3)._stream())) == 3
    wl = PreparedWorkload("prose", [[5, 6, 7]], [3])
    run = run_llama_cpp(FakeLlama(3), wl, num_prompts=2)
    assert [r["output_tokens"] for r in run["requests"]] == [3, 3]
    assert run["output_tokens"] == 6
    one = run_llama_cpp(FakeLlama(1), wl, num_prompts=1)
    assert one["requests"][0]["output_tokens"] == 1 and one["requests"][0]["tpot_s"] is None


class FakeHF:
    """A transformers model as run_hf uses it: appends max_new_tokens tokens of id 5."""

    device = torch.device("cpu")

    def __init__(self):
        self.calls: list[tuple[int, int]] = []

    def parameters(self):
        return [torch.zeros(4)]

    def generate(self, ids, attention_mask, max_new_tokens, **kw):
        assert ids.device == attention_mask.device == self.device
        self.calls.append((ids.shape[0], max_new_tokens))
        return torch.cat([ids, torch.full((ids.shape[0], max_new_tokens), 5)], dim=1)


def _baselines_lab(monkeypatch, device: str, num_threads: int | None = None):
    from specserve.bench import baselines
    from specserve.bench.lab import LabRun

    hf, llama, loaded = FakeHF(), FakeLlama(3), {}

    def load_hf(model, dtype, dev):
        loaded["hf_device"] = dev
        return hf

    monkeypatch.setattr(baselines, "hf_available", lambda: True)
    monkeypatch.setattr(baselines, "llama_cpp_available", lambda: True)
    monkeypatch.setattr(baselines, "load_hf", load_hf)
    monkeypatch.setattr(baselines, "load_llama_cpp", lambda *a: llama)
    lab = LabRun(workloads={"prose": PreparedWorkload("prose", [[5, 6, 7], [8, 9]], [3, 2])},
                 eos_token_ids=(1,))
    preset = Preset("t", ("prose",), (2,), num_prompts_override=2)
    done = []
    baselines.run_baselines(lab, preset, None, torch.float32, num_threads, 0,
                            lambda desc, n: done.append(n), device=device)
    assert sum(done) == baselines.num_baseline_points(preset)  # the progress bar's total
    return lab, hf, llama, loaded


def test_baselines_are_warmed_up_before_they_are_timed(monkeypatch):
    lab, hf, llama, loaded = _baselines_lab(monkeypatch, "cpu")
    assert loaded["hf_device"] == "cpu"
    # Untimed: a 2-token generate on one prompt and an 8-token one at the highest concurrency
    # (as the engines run a full batch first); then per wave the TTFT probe and the run.
    assert hf.calls[:2] == [(1, 2), (2, 8)] and hf.calls[2:4] == [(2, 1), (2, 3)]
    # One untimed completion, then the measured streams.
    assert llama.calls[0] == (False, 8) and all(stream for stream, _ in llama.calls[1:])
    assert [s["status"] for s in lab.strategies] == ["ok", "ok", "ok"]
    (point,) = [p for p in lab.points if p["strategy"] == "llama.cpp"]
    assert [r["output_tokens"] for r in point["runs"][0]["requests"]] == [3, 3]


def test_baselines_follow_the_engines_device_and_skip_llama_cpp_off_the_cpu(monkeypatch):
    lab, hf, llama, loaded = _baselines_lab(monkeypatch, "cuda:0")
    assert loaded["hf_device"] == "cuda:0"
    row = lab.strategies[-1]
    assert row["name"] == "llama.cpp" and row["status"] == "skipped"
    assert "CPU" in row["error"] and "cuda:0" in row["error"]
    assert llama.calls == [] and all(p["strategy"] != "llama.cpp" for p in lab.points)


def test_offline_compare_hf_loads_the_engines_own_model(tmp_path, monkeypatch):
    """A local HF directory: the HF baseline is that model (not the embedded one), on the
    engine's device, warmed up once before the timed generates."""
    from tiny_models import make_tiny_model

    from specserve import LLM
    from specserve.bench import offline

    path = str(make_tiny_model(tmp_path / "tiny"))
    llm = LLM(path, dtype="float32", kv_cache_memory=8 << 20)
    calls, models = [], []
    bench_hf = offline.bench_hf

    def recording(model, prompts, output_len):
        calls.append((len(prompts), output_len))
        models.append(model)
        return bench_hf(model, prompts, output_len)

    monkeypatch.setattr(offline, "bench_hf", recording)
    results = offline.run_offline(llm, [2], input_len=6, output_len=3, compare_hf=True,
                                  model=path)
    assert [r.system for r in results] == ["specserve", "hf-generate"]
    assert calls == [(1, 2), (2, 3)]  # the untimed warm-up first
    hf = models[0]
    assert hf.config.num_hidden_layers == 2 and hf.config.vocab_size == 64
    assert next(hf.parameters()).device == llm.engine.device


def test_the_hf_peer_decodes_plain_greedy_whatever_the_checkpoint_asks(tmp_path):
    # A generation_config.json's repetition_penalty applied to the HF peer's greedy decoding
    # and not to the engine's rows: other text, other lengths, from "the same prompts".
    from tiny_models import make_tiny_model

    from specserve.bench.offline import load_hf_model

    path = make_tiny_model(tmp_path / "m", seed=2)
    (path / "generation_config.json").write_text(json.dumps(
        {"repetition_penalty": 1.3, "top_k": 5, "eos_token_id": 1}))
    hf = load_hf_model(torch.float32, str(path))
    assert hf.generation_config.repetition_penalty in (None, 1.0)
    assert hf.generation_config.top_k in (None, 50) and hf.generation_config.eos_token_id == 1


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_the_hf_baseline_from_our_state_dict_is_the_same_model(tmp_path, arch):
    """The .gguf / embedded path rebuilds transformers' model from our loader's fused weights:
    it must compute what transformers' own loading of the checkpoint computes (an untied head,
    Qwen2's q/k/v biases, Qwen3's q/k norms)."""
    from tiny_models import make_tiny_model
    from transformers import AutoModelForCausalLM

    from specserve.bench.offline import _hf_from_state_dict
    from specserve.models.loader import load_model

    path = make_tiny_model(tmp_path / arch, arch=arch)
    ours = _hf_from_state_dict(load_model(str(path))).eval()
    theirs = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    ids = torch.tensor([[3, 9, 27, 5, 11]])
    with torch.inference_mode():
        torch.testing.assert_close(ours(ids).logits, theirs(ids).logits)


def test_speculation_table_shows_k_shares_step_prices_and_the_spread_over_requests():
    """What #4 asks the benchmark output to show: the chosen-K distribution, predicted against
    measured step time, and acceptance per request, from the run figures."""
    from rich.console import Console

    from specserve.bench.lab import RequestRecord, request_acceptance
    from specserve.bench.report import k_shares, speculation_table

    records = [RequestRecord(10, 20, 0.1, 0.01, num_draft_tokens=d, num_accepted_tokens=a)
               for d, a in [(10, 9), (10, 5), (10, 1), (0, 0)]]
    spread = request_acceptance(records)
    assert spread["requests_drafted"] == 3  # the request that never drafted is left out
    assert spread["request_acceptance_p50"] == pytest.approx(0.5)
    assert spread["request_acceptance_p10"] < 0.5 < spread["request_acceptance_p90"]
    assert k_shares({"0": 6, "4": 2}) == "0:75 4:25" and k_shares({}) == "—"
    run = {"spec_k_histogram": {"0": 6, "4": 2}, "spec_step_time_predicted_ms": 9.5,
           "spec_step_time_actual_ms": 10.25, "acceptance_rate": 0.5, **spread}
    console = Console(width=200, record=True)
    console.print(speculation_table([("ngram", "json", 4, run)], "decisions"))
    text = console.export_text()
    assert "0:75 4:25" in text and "9.50/10.25" in text and "(3)" in text


# ---- benchmark honesty: both sides of a comparison run the same thing ---------------------------
CHAT = "{% for m in messages %}{{ m['content'] }} {% endfor %}"


def test_compare_offline_samples_each_request_as_the_server_does(tmp_path):
    """The in-process side of --compare-offline samples what a specserve server samples for
    the client's body: the model's generation_config.json under the body's own fields (here a
    repetition penalty and top-k the body never sends) and max_tokens capped at its
    max_new_tokens. It decoded with a bare SamplingParams: no penalty, no cap."""
    from tiny_models import make_tiny_model

    from specserve import LLM
    from specserve.bench.online import offline_workload, request_body
    from specserve.server.protocol import ChatCompletionRequest

    path = make_tiny_model(tmp_path / "m")
    cfg = json.loads((path / "generation_config.json").read_text())
    cfg |= {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.05,
            "max_new_tokens": 3}
    (path / "generation_config.json").write_text(json.dumps(cfg))
    engine = LLM(str(path), dtype="float32", kv_cache_memory=8 << 20,
                 chat_template=CHAT).engine
    items = [WorkloadItem("a", [{"role": "user", "content": "w5 w6 w7"}], 8),
             WorkloadItem("b", [{"role": "user", "content": "w9"}], 2)]
    for cap, ignore_eos in ((None, False), (6, True)):
        wl = offline_workload(engine, "t", items, cap)
        for i, item in enumerate(items):
            body = request_body(item, "m", cap, ignore_eos)
            req = ChatCompletionRequest.model_validate(body)
            # serving.py's _capped: the model's max_new_tokens caps the body's max_tokens
            server = req.to_sampling_params(min(3, req.output_limit), None,
                                            engine.default_sampling_params())
            assert wl.params(i, ignore_eos) == server
    assert (server.temperature, server.repetition_penalty, server.top_k) == (0.0, 1.05, 20)
    assert [wl.params(i).max_tokens for i in range(2)] == [3, 2]


def test_compare_offline_warms_up_on_the_online_warm_ups_prompt(llm):
    """Both sides start their first timed run with the first prompt (rag: the document) in the
    prefix cache: the server after the client's warm-up request, the engine after
    warm_up_offline. Without it, only the in-process side prefilled it cold."""
    from specserve.bench.online import offline_workload, warm_up_offline

    engine = llm.engine
    wl = offline_workload(engine, "json", load_workload("json")[:2], 4)
    engine.reset_prefix_cache()
    warm_up_offline(engine, wl)
    run = run_workload(engine, wl, 1, 1, reset_prefix_cache=False)
    bs = engine.block_manager.block_size
    assert len(wl.prompts[0]) > bs and run["prefix_cache_hits"] >= bs


def _fake_server(deltas: list[dict], completion_tokens: int):
    """An OpenAI-compatible chat endpoint streaming the given deltas, then usage; it records
    every request body."""
    from aiohttp import web

    bodies: list[dict] = []

    async def chat(request):
        bodies.append(await request.json())
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        events = [{"choices": [{"index": 0, "delta": d}]} for d in deltas]
        events.append({"choices": [], "usage": {"prompt_tokens": 3,
                                                "completion_tokens": completion_tokens}})
        for event in events:
            await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app, bodies


def _run_against(app, items, num_prompts: int) -> dict:
    from aiohttp.test_utils import TestServer

    from specserve.bench.online import run_online_point

    async def go():
        async with TestServer(app) as server:
            return await run_online_point(str(server.make_url("")).rstrip("/"), items, 1,
                                          num_prompts, model="m")

    return asyncio.run(go())


def test_online_times_reasoning_and_tool_call_chunks_as_tokens():
    """usage counts a reasoning model's thinking and a tool call's arguments: their chunks
    time TTFT and TPOT too (vLLM's benchmark_serving). Counting only `content`, a reply of
    nothing else had no first token (TTFT = the whole request) and no TPOT."""
    from specserve.bench.online import carries_tokens

    assert carries_tokens({"reasoning_content": "hm"}) and carries_tokens({"reasoning": "hm"})
    assert carries_tokens({"tool_calls": [{"index": 0}]}) and carries_tokens({"content": "x"})
    assert not carries_tokens({"role": "assistant"}) and not carries_tokens({"content": ""})
    app, _ = _fake_server([{"role": "assistant"}, {"reasoning_content": "let me"},
                           {"reasoning_content": " think"},
                           {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}], 4)
    items = [WorkloadItem("x", [{"role": "user", "content": "hi"}], 4)]
    point = _run_against(app, items, 2)
    assert [r["output_tokens"] for r in point["requests"]] == [4, 4]
    assert all(r["tpot_s"] is not None for r in point["requests"])


def test_online_compiles_every_grammar_before_the_clock_starts():
    """The in-process side compiles every schema in prepare_workload; the server compiled each
    on first use, inside the timed run, except the warm-up item's. Now one 1-token request per
    distinct schema precedes the timed requests, on a prompt that is not the workload's."""
    schemas = [{"json": {"type": "object", "properties": {k: {"type": "string"}}}}
               for k in ("a", "b", "c")]
    items = [WorkloadItem(str(i), [{"role": "user", "content": f"item {i}"}], 4, so)
             for i, so in enumerate([schemas[0], schemas[1], schemas[0], schemas[2]])]
    app, bodies = _fake_server([{"content": "{}"}], 1)
    _run_against(app, items, 2)
    warm, timed = bodies[:-2], bodies[-2:]
    assert [b["messages"] for b in timed] == [items[0].messages, items[1].messages]
    assert warm[0]["messages"] == items[0].messages  # the warm-up proper: the first prompt
    grammar = warm[1:]
    assert sorted(json.dumps(b["structured_outputs"]) for b in grammar) == sorted(
        json.dumps(s) for s in schemas)
    assert all(b["max_tokens"] == 1 for b in grammar)
    assert not any(b["messages"] == item.messages for b in grammar for item in items)


class _FakeLlamaModule:
    """llama_cpp with a Llama that records its constructor's arguments."""

    def __init__(self):
        self.kwargs: list[dict] = []
        module = self

        class Llama:
            def __init__(self, **kw):
                module.kwargs.append(kw)

        self.Llama = Llama


def test_llama_cpp_gets_the_engines_threads_for_decode_and_prefill(monkeypatch):
    """llama-cpp-python defaults n_threads_batch (prefill) to every CPU, and n_threads was
    os.cpu_count(): both now the engines' count, --num-threads or torch's default."""
    import sys

    from specserve.bench.baselines import load_llama_cpp

    fake = _FakeLlamaModule()
    monkeypatch.setitem(sys.modules, "llama_cpp", fake)
    load_llama_cpp("m.gguf", 3, 0)
    load_llama_cpp("m.gguf", None, 0)
    assert [(k["n_threads"], k["n_threads_batch"]) for k in fake.kwargs] == [
        (3, 3), (torch.get_num_threads(), torch.get_num_threads())]


def test_hf_baselines_run_on_the_engines_thread_count(monkeypatch):
    """HF generate runs in the parent, which --num-threads never reached (only the engines'
    children set it): it now runs on that count, recorded in its rows, and the parent's count
    is restored afterwards."""
    before = torch.get_num_threads()
    threads = before + 1
    seen: list[int] = []
    generate = FakeHF.generate

    def recording(self, *args, **kw):
        seen.append(torch.get_num_threads())
        return generate(self, *args, **kw)

    monkeypatch.setattr(FakeHF, "generate", recording)
    lab, *_ = _baselines_lab(monkeypatch, "cpu", num_threads=threads)
    assert seen and set(seen) == {threads}
    assert torch.get_num_threads() == before
    assert [s["num_threads"] for s in lab.strategies] == [threads] * 3


def test_offline_prompts_stay_distinct_past_the_prose_texts(llm):
    """Above 70 prompts (prose's texts), prompt i + 70 was prompt i: with prefix caching on, a
    wave of 128 skipped ~45% of its prefill, while HF prefilled everything. No two prompts may
    share even their first block."""
    from specserve.bench.offline import make_prompts

    prompts = make_prompts(llm.get_tokenizer(), 150, 40)
    bs = llm.engine.block_manager.block_size
    assert all(len(p) == 40 for p in prompts)
    assert len({tuple(p[:bs]) for p in prompts}) == 150


def test_offline_tpot_divides_by_the_tokens_each_request_generated():
    """A request cut short (by max_model_len) generated 3 tokens of the 10 asked for: its TPOT
    is its decode time over 2 intervals, not over 9."""
    from types import SimpleNamespace

    from specserve.bench.offline import bench_engine

    def out(n: int, decode_s: float):
        metrics = SimpleNamespace(ttft=0.01, first_token_time=1.0, finished_time=1.0 + decode_s)
        return SimpleNamespace(metrics=metrics, outputs=[SimpleNamespace(token_ids=[7] * n)])

    llm = SimpleNamespace(generate=lambda prompts, params: [out(3, 0.2), out(10, 0.9)])
    r = bench_engine(llm, [[1], [2]], output_len=10)
    assert r.tpot_p50_ms == pytest.approx((100 + 100) / 2)  # 0.2 s / 2 and 0.9 s / 9


def test_every_median_over_repetitions_is_the_lower_middle():
    """One rule: the lower middle of an even count (sweep.median_run picks that run, so the
    summary's median is a value some run measured, the one the speculation table shows), and
    quartiles of few rounds stay within the rounds measured."""
    from specserve.bench.quant import _median_of
    from specserve.bench.report import paired_ratio, summarize_runs
    from specserve.bench.sweep import median_run

    runs = [{"output_tok_s": v, "tpot_p50_ms": 100 / v} for v in (30.0, 10.0)]
    assert summarize_runs(runs)["output_tok_s"]["median"] == 10.0
    assert median_run(runs)["output_tok_s"] == 10.0
    reps = [{"mode": "x", "tok_s_c1": v, "decode_tok_s_c1": v, "tok_s_batch": v}
            for v in (30.0, 10.0)]
    assert _median_of(reps)["tok_s_c1"] == 10.0
    two = paired_ratio([1.0, 3.0], [1.0, 1.0])
    assert two["median"] == 1.0 and 1.0 <= two["q1"] <= two["q3"] <= 3.0
    four = paired_ratio([1.0, 2.0, 3.0, 4.0], [1.0] * 4)
    assert (four["median"], four["q1"], four["q3"]) == (2.0, 1.75, 3.25)


def test_the_sweeps_self_draft_is_labelled_untrained(tmp_path, monkeypatch):
    """`draft` without --draft-model is the target's first 4 layers, untrained: its engine row,
    cells, table, summary and plot say so instead of passing for a draft model."""
    from specserve.bench import sweep
    from specserve.bench.plots import sweep_plots

    label = sweep.proposer_label
    assert label("draft") == "draft(self-4, untrained)"
    assert label("draft:2", "/trained") == "draft(self-2, untrained)"
    assert label("draft", "/trained") == "draft" and label("ngram") == "ngram"

    def refuse(model, kwargs):
        raise ValueError("not built in this test")

    monkeypatch.setattr(sweep, "build_llm", refuse)
    settings = sweep.SweepSettings(proposers=("draft",), policies=("off",),
                                   points=Preset("s", ("json",), (1,)))
    _, engines = sweep.run_sweep(settings, {})
    assert engines[0]["proposer"] == "draft(self-4, untrained)"
    cells = [{"proposer": "draft(self-4, untrained)", "policy": "off", "workload": "json",
              "concurrency": 1, "run": {"output_tok_s": 9.0, "tpot_p50_ms": 5.0}}]
    (png,) = sweep_plots(cells, tmp_path)
    assert png.name == "sweep_draft_self-4_untrained_json.png"


def test_the_profile_split_adds_up_to_the_steps_it_was_measured_on(llm):
    """matmul and attention came from profiled steps and `other` was the unprofiled steps'
    wall minus them: the parts did not add up, and `other` could go negative. Now all three
    come from the same steps; a GPU engine is refused (only CPU activity is recorded)."""
    from types import SimpleNamespace

    from specserve.bench.step_profile import format_profile, profile_decode_step

    row = profile_decode_step(llm, 2, context=16, num_steps=2)
    assert row["matmul_ms"] > 0 and row["overhead_ms"] >= 0
    assert row["matmul_ms"] + row["attention_ms"] + row["overhead_ms"] == pytest.approx(
        row["profiled_step_ms"])
    assert "profiled" in format_profile([row])
    gpu = SimpleNamespace(engine=SimpleNamespace(device=torch.device("cuda")))
    with pytest.raises(ValueError, match="CPU time only"):
        profile_decode_step(gpu, 1)


def test_online_tpot_spans_the_step_that_ended_the_reply():
    """A reply that ends on EOS ends with a chunk without text, which the step that generated
    the EOS sends; usage counts that token, so TPOT spans up to that chunk (3 tokens: two
    intervals, the second 0.6 s long). Timing only the text chunks read it as ~0.1 s."""
    import aiohttp
    from aiohttp import web

    from specserve.bench.online import stream_one

    def event(obj) -> bytes:
        return f"data: {json.dumps(obj)}\n\n".encode()

    async def reply(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(event({"choices": [{"index": 0, "delta": {"content": "a"}}]}))
        await asyncio.sleep(0.2)
        await resp.write(event({"choices": [{"index": 0, "delta": {"content": "b"}}]}))
        await asyncio.sleep(0.6)
        await resp.write(event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}))
        await resp.write(event({"choices": [], "usage": {"prompt_tokens": 5,
                                                         "completion_tokens": 3}}))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def main_() -> float | None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", reply)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        try:
            async with aiohttp.ClientSession() as session:
                record = await stream_one(session, f"http://127.0.0.1:{port}", {}, {})
        finally:
            await runner.cleanup()
        assert record.output_tokens == 3
        return record.tpot_s

    assert asyncio.run(main_()) >= 0.3
