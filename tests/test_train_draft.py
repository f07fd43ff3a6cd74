"""Training a draft for a target (specserve/train) on tiny random models: the dense training
forward matches the engine, a short run raises held-out agreement within its time budget, and the
saved draft is used losslessly by the engine and refused by the wrong target."""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny_models import VOCAB, make_tiny_model

from specserve import LLM, SamplingParams
from specserve.models.llama import build_model
from specserve.models.loader import load_model
from specserve.spec_decode.draft_head import to_full_vocab_probs
from specserve.train.data import DataConfig, PromptItem, Sample, build_data, split_by_kind
from specserve.train.dense_forward import dense_hidden, dense_logits, pad_batch
from specserve.train.distill import DistillConfig
from specserve.train.loop import lr_factor
from specserve.train.pipeline import train_draft
from specserve.train.save import cached_draft_path

BUDGET_S = 2.0
HEAD = 32


def _items(n: int, seed: int) -> list[PromptItem]:
    rng = random.Random(seed)
    return [PromptItem(kind="ab"[i % 2],
                       token_ids=[rng.randrange(2, VOCAB) for _ in range(rng.randrange(3, 12))])
            for i in range(n)]


def _target(path, seed: int = 3, **kw):
    return make_tiny_model(path, num_layers=4, seed=seed, **kw)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One short run: a 1-layer draft with a 32-of-64 head for a 4-layer target. A step count,
    not a time budget, ends it: the same run on any machine, however loaded (the budget has
    its own test, on a fake clock)."""
    root = tmp_path_factory.mktemp("train")
    target = _target(root / "target")
    cfg = DistillConfig(num_layers=1, head_vocab=HEAD, minutes=2, max_steps=60, lr=3e-3,
                        eval_every=10, batch_tokens=512, show_progress=False)
    outcome = train_draft(str(target), _items(48, seed=0), root / "draft", cfg,
                          data_cfg=DataConfig(max_reply_tokens=24, dtype="float32"))
    return target, outcome


def _mixed_batch() -> tuple[list[list[int]], list[SamplingParams]]:
    rng = random.Random(5)
    prompts = [[rng.randrange(2, VOCAB) for _ in range(n)] for n in (3, 7, 12, 20, 5, 33)]
    params = [SamplingParams(temperature=0, max_tokens=10 + 3 * i) for i in range(len(prompts))]
    return prompts, params


def test_dense_forward_matches_the_engine(tmp_path):
    target = _target(tmp_path / "target")
    llm = LLM(str(target), dtype="float32", kv_cache_memory=16 << 20)
    prompts, _ = _mixed_batch()
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, logprobs=0,
                                                ignore_eos=True))
    loaded = load_model(str(target))
    model = build_model(loaded.config, loaded.state_dict, torch.float32)
    seqs = [p + o.outputs[0].token_ids for p, o in zip(prompts, outs, strict=True)]
    with torch.no_grad():  # one right-padded batch of all lengths
        logprobs = dense_logits(model, pad_batch(seqs)).log_softmax(dim=-1)
    for row, (prompt, out) in enumerate(zip(prompts, outs, strict=True)):
        reply = out.outputs[0].token_ids
        lp = logprobs[row, len(prompt) - 1:len(prompt) - 1 + len(reply)]
        assert lp.argmax(dim=-1).tolist() == reply  # the engine's greedy output
        engine_lp = torch.tensor([d[t] for d, t in zip(out.outputs[0].logprobs, reply,
                                                       strict=True)])
        torch.testing.assert_close(lp[torch.arange(len(reply)), reply], engine_lp,
                                   atol=1e-4, rtol=1e-4)


def assert_training_raised_agreement(outcome) -> None:
    """Evaluated at step 0 and at the last step; held-out agreement rose by >= 5 points, and
    the report's "all" row says so too. (Shared with test_eagle.py.)"""
    evals = outcome.report["evaluations"]
    assert evals[0]["step"] == 0 and evals[-1]["step"] == outcome.result.loop.steps > 0
    assert evals[-1]["held_out_agreement"] >= evals[0]["held_out_agreement"] + 0.05
    every = outcome.report["acceptance"][-1]
    assert every["kind"] == "all" and every["after"] > every["before"]


def assert_budget_respected(loop, budget_s: float) -> None:
    """Read on the fake clock: the loop stopped for time, at its budget, and not early (it
    stops when a step and an evaluation would no longer fit; the clock's own readings around
    that check may add a few ticks of 0.01 s)."""
    assert loop.stop_reason == "time" and loop.steps > 1
    assert 0.8 * budget_s < loop.train_time <= budget_s + 0.05


def test_training_raises_held_out_agreement(trained):
    _, outcome = trained
    assert_training_raised_agreement(outcome)
    assert {r["kind"] for r in outcome.report["acceptance"]} == {"a", "b", "all"}


def test_time_budget_is_respected(tmp_path, fake_clock):
    target = _target(tmp_path / "target")
    cfg = DistillConfig(num_layers=1, head_vocab=HEAD, minutes=BUDGET_S / 60, eval_every=10,
                        batch_tokens=512, show_progress=False)
    outcome = train_draft(str(target), _items(12, seed=6), tmp_path / "draft", cfg,
                          data_cfg=DataConfig(max_reply_tokens=8, dtype="float32"))
    assert_budget_respected(outcome.result.loop, BUDGET_S)


def test_saved_directory_format(trained):
    target, outcome = trained
    out = outcome.path
    cfg = json.loads((out / "config.json").read_text())
    meta = cfg["specserve_draft"]
    assert cfg["model_type"] == "llama" and cfg["num_hidden_layers"] == 1
    assert meta["target"] == target.name and meta["shares_target_embedding"] is True
    assert (meta["target_vocab_size"], meta["hidden_size"]) == (VOCAB, 64)
    head_ids = json.loads((out / meta["head_vocab_ids_file"]).read_text())
    assert len(head_ids) == HEAD and head_ids == sorted(set(head_ids))
    weights = load_file(str(out / "model.safetensors"))
    assert not any("embed" in k for k in weights)
    assert weights["lm_head.weight"].shape == (HEAD, 64)
    report = json.loads((out / "training.json").read_text())
    # 48 prompts, 8 held out (greedy reply only), 40 trained on with 4 replies each.
    assert (report["held_out_samples"], report["train_samples"]) == (8, 4 * 40)
    assert len(set(report["train_prompt_keys"])) == 40  # what a benchmark must leave out
    from specserve.train.save import target_fingerprint

    assert report["target_fingerprint"] == target_fingerprint(str(target))  # the lab's check
    assert (out / "tokenizer.json").is_file()
    with pytest.raises(ValueError, match="shares its embedding"):
        load_model(str(out))  # alone, without its target


def test_trained_draft_is_lossless_in_a_mixed_batch(trained):
    target, outcome = trained
    prompts, params = _mixed_batch()
    ref = LLM(str(target), dtype="float32", kv_cache_memory=16 << 20).generate(prompts, params)
    spec = LLM(str(target), dtype="float32", kv_cache_memory=16 << 20,
               speculation_policy="static",
               speculative_config={"method": "draft", "model": str(outcome.path),
                                   "num_speculative_tokens": 3})
    outs = spec.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in ref]
    stats = spec.get_stats()
    assert stats["num_draft_tokens"] > 0
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    proposer = spec.engine.proposer
    assert proposer.model.embed_tokens.weight is spec.engine.model.embed_tokens.weight
    # The loaded draft computes what was trained (the save / load round trip is exact).
    draft = outcome.result.draft
    seqs = [it.token_ids for it in outcome.result.held_out[:4]]
    with torch.no_grad():
        ids = pad_batch(seqs)
        want = draft(draft.hidden(spec.engine.model.embed_tokens(ids)))
        got = proposer.model.lm_head(dense_hidden(proposer.model, ids))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # Random requests get full-vocabulary draft probabilities and run through rejection
    # (unseeded: a seeded sampled request drafts nothing).
    torch.manual_seed(1)
    drafted = spec.get_stats()["num_draft_tokens"]
    outs = spec.generate(prompts, SamplingParams(temperature=0.8, max_tokens=6))
    assert all(len(o.outputs[0].token_ids) == 6 or o.outputs[0].finish_reason == "stop"
               for o in outs)
    assert spec.get_stats()["num_draft_tokens"] > drafted


def test_int4_draft_is_calibrated_on_its_training_data_and_lossless(trained):
    """A saved draft carries a sample of its training sequences; served with int4 weights it
    is quantized by GPTQ on them (not rounded to nearest), and stays lossless."""
    from specserve.quant.int4 import Int4Linear, quantize_int4

    target, outcome = trained
    meta = json.loads((outcome.path / "config.json").read_text())["specserve_draft"]
    calibration = json.loads((outcome.path / meta["calibration_file"]).read_text())
    # Whole training sequences (a prompt and a reply), none from a held-out prompt.
    prompts = [it.token_ids for it in _items(48, seed=0)]
    held_out = [it.token_ids[:it.start + 1] for it in outcome.result.held_out]
    assert calibration and all(
        any(c[:len(p)] == p and len(c) > len(p) for p in prompts)
        and not any(c[:len(h)] == h for h in held_out) for c in calibration)
    prompts, params = _mixed_batch()
    ref = LLM(str(target), dtype="float32", kv_cache_memory=16 << 20).generate(prompts, params)
    spec = LLM(str(target), dtype="float32", kv_cache_memory=16 << 20,
               speculation_policy="static",
               speculative_config={"method": "draft", "model": str(outcome.path),
                                   "num_speculative_tokens": 3, "quantization": "int4"})
    outs = spec.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in ref]
    assert spec.get_stats()["num_draft_tokens"] > 0
    down = spec.engine.proposer.model.layers[0].mlp.down_proj
    assert isinstance(down, Int4Linear)
    saved = load_file(str(outcome.path / "model.safetensors"))
    rounded = Int4Linear(*quantize_int4(saved["model.layers.0.mlp.down_proj.weight"], 32), 32,
                         compute_dtype=down.compute_dtype)
    assert not torch.equal(down.weight, rounded.weight)  # other integers than rounding's


def test_reduced_head_probabilities_are_zero_outside_the_head():
    head_ids = torch.tensor([1, 5, 9])
    probs = torch.tensor([[0.2, 0.3, 0.5], [1.0, 0.0, 0.0]])
    full = to_full_vocab_probs(probs, head_ids, 12)
    assert full.shape == (2, 12)
    torch.testing.assert_close(full.sum(dim=-1), torch.ones(2))
    assert full[:, head_ids].equal(probs)
    assert full[:, [i for i in range(12) if i not in (1, 5, 9)]].abs().sum() == 0


def test_draft_for_another_target_is_refused(trained, tmp_path):
    _, outcome = trained
    spec = {"method": "draft", "model": str(outcome.path)}
    other_weights = _target(tmp_path / "seed7", seed=7)
    with pytest.raises(ValueError, match="trained for a different target"):
        LLM(str(other_weights), dtype="float32", speculative_config=spec)
    other_hidden = make_tiny_model(tmp_path / "hidden32", num_layers=4, hidden_size=32)
    with pytest.raises(ValueError, match="trained for a different target.*hidden size 64"):
        LLM(str(other_hidden), dtype="float32", speculative_config=spec)
    # The same weights behind another tokenizer (other words for the same ids).
    other_tok = shutil.copytree(trained[0], tmp_path / "other_tok")
    tok = json.loads((other_tok / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    tok["model"]["vocab"] = {(k if k.startswith("<") else "v" + k[1:]): v
                             for k, v in vocab.items()}
    (other_tok / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ValueError, match="tokenizer does not match"):
        LLM(str(other_tok), dtype="float32", speculative_config=spec)


def test_a_draft_whose_head_ids_do_not_fit_its_head_is_refused(trained, tmp_path):
    """A repeated id would under-report the draft's q for that token (accepted too often); a
    list of another length reads every guess with the wrong token."""
    target, outcome = trained
    for name, edit in (("repeat", lambda ids: [ids[0]] + ids[:-1]), ("name", lambda ids: ids[1:]),
                       ("out of the vocabulary", lambda ids: ids[:-1] + [10**6])):
        draft = shutil.copytree(outcome.path, tmp_path / name.replace(" ", "-"))
        ids = json.loads((draft / "head_ids.json").read_text())
        (draft / "head_ids.json").write_text(json.dumps(edit(ids)))
        with pytest.raises(ValueError, match=name):
            LLM(str(target), dtype="float32",
                speculative_config={"method": "draft", "model": str(draft)})


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_qwen_targets_round_trip(tmp_path, arch):
    """Qwen2's attention biases survive saving as a llama config, Qwen3's q/k norms as a qwen3
    one (a few steps, no time budget)."""
    target = make_tiny_model(tmp_path / "qwen", arch=arch, num_layers=2, seed=4)
    cfg = DistillConfig(num_layers=1, head_vocab=0, minutes=1, max_steps=3, eval_every=2,
                        batch_tokens=512, show_progress=False)
    outcome = train_draft(str(target), _items(12, seed=1), tmp_path / "draft", cfg,
                          data_cfg=DataConfig(max_reply_tokens=8, dtype="float32"))
    assert outcome.result.loop.stop_reason == "max_steps" and outcome.result.loop.steps == 3
    saved = json.loads((outcome.path / "config.json").read_text())
    assert saved["attention_bias"] is (arch == "qwen2")
    assert saved["model_type"] == ("qwen3" if arch == "qwen3" else "llama")
    prompts, params = _mixed_batch()
    ref = LLM(str(target), dtype="float32", kv_cache_memory=16 << 20).generate(prompts, params)
    spec = LLM(str(target), dtype="float32", kv_cache_memory=16 << 20,
               speculative_config={"method": "draft", "model": str(outcome.path)})
    outs = spec.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in ref]
    assert spec.engine.proposer.head_ids is None  # head_vocab=0: the full vocabulary


@pytest.mark.parametrize("bf16", [False, True])
def test_bf16_teacher_with_and_without_autocast(tmp_path, bf16):
    """The default set-up: the teacher is the target in bf16 (as served), its cached hidden
    states are bf16, and the draft's fp32 weights train with or without bf16 autocast."""
    cfg = DistillConfig(num_layers=1, head_vocab=HEAD, minutes=1, max_steps=2, eval_every=1,
                        batch_tokens=512, bf16=bf16, show_progress=False)
    outcome = train_draft(str(_target(tmp_path / "target")), _items(12, seed=4),
                          tmp_path / "draft", cfg,
                          data_cfg=DataConfig(max_reply_tokens=8, replies_per_prompt=2))
    evals = outcome.report["evaluations"]
    assert [e["step"] for e in evals] == [0, 1, 2]
    assert all(torch.isfinite(torch.tensor(e["loss"])) for e in evals[1:])
    assert all(p.dtype == torch.float32 for p in outcome.result.draft.parameters())


def test_lr_warms_up_then_follows_a_cosine_over_the_time_budget():
    cfg = DistillConfig(lr=1.0, warmup_steps=10, final_lr_fraction=0.1)
    assert lr_factor(0, 0.0, 60, cfg) == pytest.approx(0.1)  # warm-up: step 1 of 10
    assert lr_factor(9, 0.0, 60, cfg) == pytest.approx(1.0)
    assert lr_factor(500, 30.0, 60, cfg) == pytest.approx(0.55)  # half the budget
    assert lr_factor(500, 60.0, 60, cfg) == pytest.approx(0.1)
    assert lr_factor(500, 90.0, 60, cfg) == pytest.approx(0.1)  # past the deadline


def test_split_is_seeded_and_stratified():
    samples = [Sample("ab"[i % 2], [i, i + 1], 1) for i in range(40)]
    train, held = split_by_kind(samples, 0.15, seed=0)
    assert split_by_kind(samples, 0.15, seed=0) == (train, held)
    assert split_by_kind(samples, 0.15, seed=1) != (train, held)
    assert len(held) == 6 and {s.kind for s in held} == {"a", "b"}
    assert len(train) + len(held) == 40


def test_prompts_that_differ_only_in_whitespace_are_one_prompt():
    """Held out, a copy with a trailing or doubled space measures what the draft trained on."""
    from specserve.train.data import unique_prompts

    def chat(text: str) -> list[dict]:
        return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]

    items = [PromptItem("a", text="Name a  colour."), PromptItem("a", text="Name a colour. "),
             PromptItem("b", messages=chat("Why is the sky blue?")),
             PromptItem("b", messages=chat("Why is the\nsky blue?  ")),
             PromptItem("b", messages=chat("Why is the sea blue?")),
             PromptItem("c", token_ids=[5, 6]), PromptItem("c", token_ids=[5, 6, 7])]
    assert unique_prompts(items) == [items[0], items[2], items[4], items[5], items[6]]


def test_data_holds_out_whole_prompts_and_samples_extra_replies(tmp_path):
    llm = LLM(str(_target(tmp_path / "target")), dtype="float32", kv_cache_memory=16 << 20)
    items = _items(20, seed=2)
    cfg = DataConfig(max_reply_tokens=12, replies_per_prompt=3, reply_temperature=1.0)
    data = build_data(llm, items, cfg, seed=0)
    again = build_data(llm, items, cfg, seed=0)  # seeded: the same data
    assert (again.train, again.held_out) == (data.train, data.held_out)

    def prompt(sample: Sample) -> tuple[int, ...]:
        return tuple(sample.token_ids[:sample.prompt_len])

    train_prompts = [prompt(s) for s in data.train]
    held_prompts = [prompt(s) for s in data.held_out]
    assert not set(train_prompts) & set(held_prompts)
    assert len(held_prompts) == len(set(held_prompts)) == 4  # greedy only: one per prompt
    assert all(train_prompts.count(p) == 3 for p in set(train_prompts))
    # Per training prompt: the greedy reply (what a greedy engine says) and two sampled ones.
    greedy = llm.generate([list(p) for p in dict.fromkeys(train_prompts)],
                          SamplingParams(temperature=0, max_tokens=12))
    firsts = {prompt(s): s.token_ids for s in reversed(data.train)}  # first sample per prompt
    assert [firsts[tuple(o.prompt_token_ids)] for o in greedy] == [
        list(o.prompt_token_ids) + list(o.outputs[0].token_ids) for o in greedy]
    assert any(len({tuple(s.token_ids) for s in data.train if prompt(s) == p}) > 1
               for p in set(train_prompts))
    # Repeated prompts (a prompts file with a line twice, the same prompts under two kinds)
    # are one prompt: no copy lands on the other side of the split.
    twice = items + [PromptItem(kind="again", text=i.text, token_ids=i.token_ids,
                                messages=i.messages) for i in items]
    dup = build_data(llm, twice, cfg, seed=0)
    assert (dup.train, dup.held_out) == (data.train, data.held_out)


def test_a_whitespace_twin_of_a_train_prompt_is_listed_as_trained_on(tmp_path):
    # unique_prompts folds "A" and "A " into one prompt; the lab timed the twin as unseen.
    from specserve.train.data import prompt_key

    llm = LLM(str(_target(tmp_path / "target")), dtype="float32", kv_cache_memory=16 << 20)
    items = [PromptItem(kind="k", text=f"w{i} w{i + 1}") for i in range(10)]
    twins = [PromptItem(kind="k", text=f" w{i}  w{i + 1} ") for i in range(10)]
    data = build_data(llm, items + twins, DataConfig(max_reply_tokens=4), seed=0)
    keys = set(data.train_prompt_keys)
    trained = [i for i in range(10) if prompt_key(text=items[i].text) in keys]
    assert 0 < len(trained) < 10
    assert {prompt_key(text=twins[i].text) for i in range(10)} & keys == \
        {prompt_key(text=twins[i].text) for i in trained}


def test_prompts_the_engine_cannot_serve_are_left_out_not_fatal(tmp_path, caplog):
    # One empty or over-long prompt failed the whole batch (maybe after all training replies).
    llm = LLM(str(_target(tmp_path / "target")), dtype="float32", kv_cache_memory=16 << 20,
              max_model_len=64)
    items = _items(12, seed=4)
    bad = [PromptItem(kind="a", token_ids=[5] * 80), PromptItem(kind="b", token_ids=[])]
    with caplog.at_level("WARNING", logger="specserve"):
        data = build_data(llm, items + bad, DataConfig(max_reply_tokens=8), seed=0)
    assert "left out 2 prompts" in caplog.text
    assert all(0 < s.prompt_len < 64 for s in data.train + data.held_out)
    assert (data.train, data.held_out) == (lambda d: (d.train, d.held_out))(
        build_data(llm, items, DataConfig(max_reply_tokens=8), seed=0))


def test_what_cannot_work_fails_before_the_target_loads(tmp_path, monkeypatch):
    from specserve.train import pipeline

    def no_engine(*args, **kwargs):
        raise AssertionError("the target was loaded")

    monkeypatch.setattr("specserve.llm.LLM", no_engine)
    target = str(_target(tmp_path / "target"))
    alone = [PromptItem(kind=str(i), token_ids=[i + 2, 7, 9]) for i in range(6)]
    with pytest.raises(ValueError, match="every kind has one prompt"):
        pipeline.train_draft(target, alone, tmp_path / "out", DistillConfig(num_layers=1))
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="not a writable directory"):
        pipeline.train_draft(target, _items(8, 0), tmp_path / "file" / "out",
                             DistillConfig(num_layers=1))
    with pytest.raises(ValueError, match="lr must be > 0"):
        DistillConfig(lr=-1e-3)


def test_cli(tmp_path, capsys):
    from specserve.train.cli import add_train_parser

    parser = argparse.ArgumentParser()
    add_train_parser(parser.add_subparsers())
    # A short real run from a prompts file: text and token-id prompts, two kinds.
    target = make_tiny_model(tmp_path / "target", num_layers=2)
    lines = [{"prompt": f"w{i % 60 + 2} w{i * 7 % 60 + 2} w5", "kind": "text"} for i in range(6)]
    lines += [{"prompt_token_ids": [i + 2, 9, 4], "kind": "ids"} for i in range(6)]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    args = parser.parse_args(["train-draft", "--model", str(target), "--prompts", str(prompts),
                              "--minutes", "0.005", "--out", str(tmp_path / "draft"),
                              "--layers", "1", "--head-vocab", "16", "--max-reply-tokens", "6",
                              "--dtype", "float32"])
    args.func(args)
    report = json.loads((tmp_path / "draft" / "training.json").read_text())
    assert report["head_vocab_size"] == 16 and report["source"].startswith("prompts:")
    # A kind whose held-out replies are one token long has no position to report (the reply's
    # first token is not counted: serving never guesses it).
    kinds = {r["kind"] for r in report["acceptance"]}
    assert {"text", "all"} <= kinds <= {"text", "ids", "all"}
    # The train prompts are listed by key: the split the report's settings make again.
    from specserve.train.data import prompt_key, read_prompts_jsonl, split_by_kind

    train, _ = split_by_kind(read_prompts_jsonl(prompts), report["settings"]["held_out_fraction"],
                             report["settings"]["seed"])
    assert sorted(report["train_prompt_keys"]) == sorted(
        prompt_key(p.messages, p.text, p.token_ids) for p in train)
    assert "held-out agreement" in capsys.readouterr().out
    # The same prompts train an EAGLE head through the same command.
    args = parser.parse_args(["train-draft", "--method", "eagle", "--model", str(target),
                              "--prompts", str(prompts), "--minutes", "0.005", "--out",
                              str(tmp_path / "eagle"), "--head-vocab", "16",
                              "--max-reply-tokens", "6", "--dtype", "float32"])
    args.func(args)
    report = json.loads((tmp_path / "eagle" / "training.json").read_text())
    assert report["method"] == "eagle" and report["head_vocab_size"] == 16
    assert (tmp_path / "eagle" / "eagle.json").is_file()
    assert "trained eagle saved to" in capsys.readouterr().out
    assert cached_draft_path(None, "prose,json", 3).parts[-2:] == (
        "drafts", "SmolLM2-135M-Instruct-prose+json-3")  # the embedded model
    # A local directory: its name and a digest of its path, so that two checkpoints with the
    # same folder name, or a local copy of the embedded model, get drafts of their own.
    path = cached_draft_path("/models/SmolLM2-135M-Instruct/", "prose,json", 3)
    assert path.parts[-2] == "drafts" and path.name.startswith("SmolLM2-135M-Instruct.")
    assert path.name.endswith("-prose+json-3")
    assert path == cached_draft_path("/models/../models/SmolLM2-135M-Instruct", "prose,json", 3)
    assert path != cached_draft_path(None, "prose,json", 3)
    assert cached_draft_path("embedded", "prose", 3) == cached_draft_path(None, "prose", 3)
    assert (cached_draft_path("/runs/a/final", "prose", 3)
            != cached_draft_path("/runs/b/final", "prose", 3))


@pytest.mark.parametrize("method", ["draft", "eagle"])
def test_a_setting_the_target_cannot_take_fails_before_generation(tmp_path, monkeypatch, method):
    """--layers past the target's depth, or --feature-layers that are not layers below its
    last, used to fail after the replies were generated and the teacher pass run (minutes)."""
    from specserve.train import pipeline
    from specserve.train.eagle import EagleConfig

    def no_generation(*args, **kwargs):
        raise AssertionError("generation started")

    monkeypatch.setattr(pipeline, "build_data", no_generation)
    target = str(_target(tmp_path / "target"))  # 4 layers
    with pytest.raises(ValueError, match="the draft needs 1..4 layers|below the last"):
        if method == "draft":
            pipeline.train_draft(target, _items(8, 0), tmp_path / "out",
                                 DistillConfig(num_layers=5))
        else:
            pipeline.train_eagle_head(target, _items(8, 0), tmp_path / "out",
                                      EagleConfig(feature_layers=(3,)))


def test_a_draft_directory_is_replaced_whole_or_not_at_all(tmp_path):
    """A save that fails midway (a killed run) leaves the earlier draft as it was, not the new
    weights beside the old head ids; a directory of other files is never replaced."""
    from specserve.train.whole_dir import written_whole

    out = tmp_path / "draft"
    with written_whole(out) as d:
        (d / "eagle.json").write_text("{}")
        (d / "head_ids.json").write_text("[1, 2]")
    with pytest.raises(KeyboardInterrupt), written_whole(out) as d:
        (d / "eagle.json").write_text("{}")
        (d / "model.safetensors").write_text("new")
        raise KeyboardInterrupt  # killed before the head ids were written
    assert sorted(p.name for p in out.iterdir()) == ["eagle.json", "head_ids.json"]
    assert (out / "head_ids.json").read_text() == "[1, 2]"
    with written_whole(out) as d:
        (d / "eagle.json").write_text("{}")
    assert [p.name for p in out.iterdir()] == ["eagle.json"]  # nothing stale kept
    assert [p.name for p in tmp_path.iterdir()] == ["draft"]  # no partial directories left
    other = tmp_path / "notes"
    other.mkdir()
    (other / "todo.txt").write_text("keep me")
    with pytest.raises(ValueError, match="not a specserve draft"), written_whole(other):
        pass
    assert (other / "todo.txt").read_text() == "keep me"
    # train-draft checks its --out before it generates any data or loads the target
    with pytest.raises(ValueError, match="not a specserve draft"):
        train_draft("/nonexistent/target", [], other, DistillConfig())
    # --out . (or the directory holding it) is refused before the run: replaced whole, it
    # would leave the shell in a deleted directory, and "." failed at the save, after the run
    here = tmp_path / "here"
    here.mkdir()
    with contextlib.chdir(here):
        for out in (Path("."), here, tmp_path):
            with pytest.raises(ValueError, match="current directory"):
                train_draft("/nonexistent/target", [], out, DistillConfig())


def _tiny_loop(fake_clock, tick: float, **cfg):
    """train_within_budget on a 4-parameter quadratic, the clock advancing `tick` per reading."""
    import random

    from specserve.train.loop import BudgetConfig, train_within_budget

    fake_clock.tick = tick
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4))
    target = torch.arange(4.0)
    result = train_within_budget([w], [[0], [1]], lambda batch: ((w - target) ** 2).sum(),
                                 lambda step: 0.0,
                                 BudgetConfig(show_progress=False, bf16=False, **cfg),
                                 random.Random(0))
    return w.detach().clone(), result


def test_max_steps_makes_the_run_the_same_on_a_slow_or_fast_machine(fake_clock):
    """With max_steps the learning rate follows the steps: two clocks, one draft. (It followed
    the clock, so a loaded machine trained another draft from the same seed.)"""
    fast, r1 = _tiny_loop(fake_clock, 0.001, minutes=1, max_steps=30, lr=0.1, warmup_steps=2)
    slow, r2 = _tiny_loop(fake_clock, 0.05, minutes=1, max_steps=30, lr=0.1, warmup_steps=2)
    assert r1.steps == r2.steps == 30 and torch.equal(fast, slow)


def test_a_budget_that_ends_before_the_first_step_is_an_error(fake_clock):
    with pytest.raises(ValueError, match="no training step was made"):
        _tiny_loop(fake_clock, 10.0, minutes=0.1)


def test_the_reduced_head_always_holds_the_end_of_sequence_ids():
    """A token with next to no mass (the EOS of replies cut at the length cap) stays in the head
    when it ends sequences: without it the draft could never guess an end."""
    from specserve.train.draft_net import select_head_ids

    torch.manual_seed(0)
    lm_head = torch.randn(50, 8)
    lm_head[7] = -100.0  # token 7: next to no mass over the (positive) rows below
    rows = [torch.randn(64, 8).abs()]
    assert 7 not in select_head_ids(rows, lm_head, 10).tolist()
    ids = select_head_ids(rows, lm_head, 10, always=(7,))
    assert 7 in ids.tolist() and len(ids) == 10 and ids.tolist() == sorted(ids.tolist())
