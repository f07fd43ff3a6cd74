"""EAGLE heads (spec_decode/eagle*.py, train/eagle.py) on tiny random models: a short training
run raises held-out agreement, the saved head is used losslessly inside a mixed batch (with the
target's features handed over step by step), and a head for another target is refused."""

from __future__ import annotations

import dataclasses
import json
import shutil
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from test_train_draft import (
    _items,
    _mixed_batch,
    assert_budget_respected,
    assert_training_raised_agreement,
)
from tiny_models import VOCAB, make_tiny_model

from specserve import LLM, SamplingParams
from specserve.models.llama import build_model
from specserve.models.loader import load_model
from specserve.spec_decode.eagle import EagleSeq
from specserve.train.data import DataConfig, Sample
from specserve.train.eagle import EagleConfig, default_feature_layers, featurize, head_outputs
from specserve.train.pipeline import train_eagle_head

BUDGET_S = 3.0
HEAD = 32
KV = 16 << 20


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One 60-step run (about a second): an EAGLE head with a 32-of-64 LM head for a 4-layer
    target. Counted in steps, not seconds, so a loaded machine trains the same head."""
    root = tmp_path_factory.mktemp("eagle")
    target = make_tiny_model(root / "target", num_layers=4, seed=3)
    cfg = EagleConfig(head_vocab=HEAD, minutes=2, max_steps=60, lr=3e-3, eval_every=10,
                      batch_tokens=512, show_progress=False)
    outcome = train_eagle_head(str(target), _items(48, seed=0), root / "head", cfg,
                               data_cfg=DataConfig(max_reply_tokens=24, dtype="float32"))
    return target, outcome


def _spec(target, path, **kw) -> LLM:
    return LLM(str(target), dtype="float32", kv_cache_memory=KV, speculation_policy="static",
               speculative_config={"method": "eagle", "model": str(path),
                                   "num_speculative_tokens": 3}, **kw)


def test_training_raises_held_out_agreement(trained):
    _, outcome = trained
    assert outcome.result.loop.stop_reason == "max_steps"
    assert_training_raised_agreement(outcome)


def test_time_budget_is_respected(trained, tmp_path, fake_clock):
    target, _ = trained
    cfg = EagleConfig(head_vocab=HEAD, minutes=BUDGET_S / 60, eval_every=10, batch_tokens=512,
                      show_progress=False)
    outcome = train_eagle_head(str(target), _items(12, seed=6), tmp_path / "head", cfg,
                               data_cfg=DataConfig(max_reply_tokens=8, dtype="float32"))
    assert_budget_respected(outcome.result.loop, BUDGET_S)


def test_bf16_teacher_without_autocast(tmp_path):
    """Features cached from the bf16 target (as served) feed an fp32 head without autocast."""
    target = make_tiny_model(tmp_path / "target", num_layers=4, seed=3)
    cfg = EagleConfig(head_vocab=HEAD, minutes=1, max_steps=2, eval_every=1, batch_tokens=512,
                      bf16=False, show_progress=False)
    outcome = train_eagle_head(str(target), _items(12, seed=4), tmp_path / "head", cfg,
                               data_cfg=DataConfig(max_reply_tokens=8, replies_per_prompt=2))
    evals = outcome.report["evaluations"]
    assert [e["step"] for e in evals] == [0, 1, 2]
    assert all(torch.isfinite(torch.tensor(e["loss"])) for e in evals[1:])
    assert outcome.result.before and outcome.report["recipe"] >= 3


def test_a_qwen3_targets_head_trains_and_serves_losslessly(tmp_path):
    """Qwen3's layers carry q/k norms: the head copied from its last layer does too, and it is
    saved, loaded and verified like any other."""
    target = make_tiny_model(tmp_path / "qwen3", arch="qwen3", num_layers=4, seed=3)
    cfg = EagleConfig(head_vocab=HEAD, minutes=1, max_steps=2, eval_every=2, batch_tokens=512,
                      show_progress=False)
    outcome = train_eagle_head(str(target), _items(12, seed=4), tmp_path / "head", cfg,
                               data_cfg=DataConfig(max_reply_tokens=8, dtype="float32"))
    assert "layers.0.attn.q_norm.weight" in load_file(str(outcome.path / "model.safetensors"))
    prompts, params = _mixed_batch()
    ref = LLM(str(target), dtype="float32", kv_cache_memory=KV).generate(prompts, params)
    spec = _spec(target, outcome.path)
    assert [o.outputs[0].token_ids for o in spec.generate(prompts, params)] == \
        [o.outputs[0].token_ids for o in ref]
    assert spec.get_stats()["num_draft_tokens"] > 0


def test_saved_directory_format(trained):
    target, outcome = trained
    out = outcome.path
    meta = json.loads((out / "eagle.json").read_text())["specserve_eagle"]
    assert meta["target"] == target.name and meta["head_vocab_size"] == HEAD
    assert (meta["target_vocab_size"], meta["hidden_size"]) == (VOCAB, 64)
    assert meta["feature_layers"] == [1]  # a 4-layer target: its layer 1 beside the final
    weights = load_file(str(out / "model.safetensors"))
    # [embedding | final feature | layer 1's stream] -> hidden
    assert weights["fc.weight"].shape == (64, 192)
    assert not any(k.startswith(("lm_head", "embed")) for k in weights)  # the target's
    assert len(json.loads((out / "head_ids.json").read_text())) == HEAD
    assert (out / "tokenizer.json").is_file() and (out / "training.json").is_file()


def test_eagle_is_lossless_in_a_mixed_batch(trained):
    target, outcome = trained
    prompts, params = _mixed_batch()
    ref = LLM(str(target), dtype="float32", kv_cache_memory=KV).generate(prompts, params)
    spec = _spec(target, outcome.path)
    outs = spec.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in ref]
    stats = spec.get_stats()
    assert stats["spec_method"] == "eagle" and stats["num_draft_tokens"] > 0
    assert stats["num_accepted_tokens"] > 0  # the head learned something it can use
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    assert not spec.engine.proposer.seqs  # every request's features and blocks were freed
    # Prompt logprobs are read from the final feature, with the fused layer streams beside it.
    scored = dataclasses.replace(params[-1], prompt_logprobs=2)
    got, want = (llm.generate(prompts[2:4], scored) for llm in (spec, LLM(
        str(target), dtype="float32", kv_cache_memory=KV)))
    for a, b in zip(got, want, strict=True):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert len(a.prompt_logprobs) == len(b.prompt_logprobs) and a.prompt_logprobs[0] is None
        for x, y in zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:], strict=True):
            assert x.keys() == y.keys()
            assert [x[t].logprob for t in x] == pytest.approx([y[t].logprob for t in x],
                                                              abs=1e-4)
    # Random requests run through rejection sampling with the head's probabilities (unseeded:
    # a seeded sampled request drafts nothing).
    torch.manual_seed(1)
    drafted = stats["num_draft_tokens"]
    outs = spec.generate(prompts, SamplingParams(temperature=0.8, max_tokens=6))
    assert all(len(o.outputs[0].token_ids) == 6 or o.outputs[0].finish_reason == "stop"
               for o in outs)
    assert spec.get_stats()["num_draft_tokens"] > drafted


def test_under_off_the_target_computes_no_features_for_the_head(trained, monkeypatch):
    """Under the engine's `off` the forwards return no layer streams and the head is handed
    nothing: a step costs what it costs without a head. A request's own `static` still drafts
    (with its features), losslessly."""
    import dataclasses

    target, outcome = trained
    prompts, params = _mixed_batch()
    ref = LLM(str(target), dtype="float32", kv_cache_memory=KV).generate(prompts, params)
    spec = _spec(target, outcome.path)
    spec.engine.set_speculation_policy("off")
    engine, head = spec.engine, spec.engine.proposer
    widths, handed = [], []
    execute, hand = engine.runner.execute, head.on_target_hidden
    engine.runner.execute = lambda *a, **k: widths.append(
        len(engine.runner.aux_layers)) or execute(*a, **k)
    head.on_target_hidden = lambda hidden, rows: handed.append(len(rows)) or hand(hidden, rows)
    outs = spec.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in ref]
    assert widths and not any(widths) and not handed
    assert spec.get_stats()["num_draft_tokens"] == 0
    static = [dataclasses.replace(p, speculation_policy="static") for p in params]
    outs = spec.generate(prompts, static)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in ref]
    assert any(widths) and handed and spec.get_stats()["num_draft_tokens"] > 0
    # A first switch to adaptive after steps under `off` profiles the forward that drafts
    # will run: with the layer streams.
    from specserve.engine import llm_engine

    spec.generate(prompts[:1], params[:1])  # off: the streams are off after it
    profiled, profile = [], llm_engine.profile_forward
    monkeypatch.setattr(llm_engine, "profile_forward", lambda runner, *a, **k: profiled.append(
        (runner is engine.runner, runner.aux_layers)) or profile(runner, *a, **k))
    engine.set_speculation_policy("adaptive")
    assert (True, head.aux_layers) in profiled and head.aux_layers


def test_a_long_catch_up_runs_in_chunks_and_guesses_the_same(trained):
    # Off the CPU kernel (every GPU run) attention materialises its scores: a head's first
    # catch-up over a long prompt was one forward (~4 GiB of scores at 8k tokens).
    target, outcome = trained
    prompts = [[(5 * i + j) % 60 + 2 for i in range(30 + 7 * j)] for j in range(3)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    guesses, runs = {}, []
    for chunk in (None, 8):
        spec = _spec(target, outcome.path)
        proposer = spec.engine.proposer
        proposer.catch_up_chunk = chunk
        guesses[chunk] = record_first_guesses(proposer)
        if chunk:
            prepare = proposer.runner.prepare

            def record(batch, prepare=prepare):
                runs.extend(n for _, n in batch)
                return prepare(batch)

            proposer.runner.prepare = record
        outs = spec.generate(prompts, params)
        assert spec.get_stats()["num_draft_tokens"] > 0
    assert max(runs) == 8
    assert guesses[8] == guesses[None]  # the same head KV, computed in pieces
    ref = LLM(str(target), dtype="float32", kv_cache_memory=KV).generate(prompts, params)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in ref]


def test_a_preempted_request_keeps_the_features_of_its_tokens(trained):
    # Readmitted with its prefix cached, a request gets only its tail's features again: the
    # head restarted on a window of zeros (acceptance fell for the rest of the request).
    target, outcome = trained
    prompts = [[(7 * i + j) % 60 + 2 for j in range(40)] for i in range(6)]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    ref = LLM(str(target), dtype="float32", kv_cache_memory=KV).generate(prompts, params)
    spec = _spec(target, outcome.path, num_blocks=14)
    proposer = spec.engine.proposer
    kept = []
    preempt = proposer.on_preempted

    def spy(req):
        preempt(req)
        seq = proposer.seqs.get(req.request_id)
        kept.append(0 if seq is None else seq.num_real)

    proposer.on_preempted = spy
    outs = spec.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in ref]
    stats = spec.get_stats()
    assert stats["num_preemptions"] > 0 and kept
    assert min(kept) > spec.engine.block_manager.block_size  # more than a readmission gives
    # (the head goes on from where it was: the positions it computed, its KV)
    assert not proposer.seqs and stats["kv_blocks_free"] == stats["kv_blocks_total"]
    assert proposer.block_manager.num_free_blocks == proposer.block_manager.num_blocks


def test_eagle_runs_in_bf16_with_packed_weights(trained):
    """bf16 packs the head's linears for oneDNN (no .weight left): serving must not need it."""
    target, outcome = trained
    llm = LLM(str(target), dtype="bfloat16", kv_cache_memory=KV, speculation_policy="adaptive",
              speculative_config={"method": "eagle", "model": str(outcome.path)})
    prompts, params = _mixed_batch()
    llm.engine.set_speculation_policy("static", 3)
    outs = llm.generate(prompts, params)
    assert all(o.outputs[0].token_ids for o in outs)
    stats = llm.get_stats()
    assert stats["num_draft_tokens"] > 0 and stats["draft_weight_bytes"] > 0
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    head_pool = llm.engine.proposer.block_manager
    assert head_pool.num_free_blocks == head_pool.num_blocks  # the head's own pool too


def record_first_guesses(proposer) -> list[tuple[int, int]]:
    """Wrap proposer.propose; the returned list fills with (position of the last known token,
    first guess after it) for every request it proposes for."""
    seen: list[tuple[int, int]] = []
    propose = proposer.propose

    def record(reqs, ks):
        proposal = propose(reqs, ks)
        seen.extend((len(r.all_token_ids) - 1, toks[0])
                    for r, k, toks in zip(reqs, ks, proposal.token_ids, strict=True) if k)
        return proposal

    proposer.propose = record
    return seen


def test_the_engine_head_guesses_what_the_trained_head_guesses(trained):
    """In the engine the head reads features the target hands over step by step (paged KV,
    catch-up after every verification); its first guess at each position must be the dense
    training forward's guess on the same tokens (the save / load round trip included)."""
    target, outcome = trained
    spec = LLM(str(target), dtype="float32", kv_cache_memory=KV, speculation_policy="static",
               speculative_config={"method": "eagle", "model": str(outcome.path),
                                   "num_speculative_tokens": 1})
    proposer = spec.engine.proposer
    seen = record_first_guesses(proposer)
    trained_head = outcome.result.head
    checked = 0
    for it in outcome.result.held_out[:4]:
        seen.clear()
        out = spec.generate([it.token_ids[:it.start + 1]],
                            SamplingParams(temperature=0, max_tokens=it.num_positions))
        assert out[0].outputs[0].token_ids == it.token_ids[it.start + 1:]  # the data's reply
        with torch.no_grad():
            pred, _ = head_outputs(trained_head, [it])
            dense = trained_head.to_full_ids(trained_head.compute_logits(pred).argmax(dim=-1))
        assert seen
        for pos, guess in seen:
            assert guess == int(dense[pos - it.start]), pos
        checked += len(seen)
    assert checked >= 8


def test_default_feature_layers_are_a_low_and_a_middle_one():
    assert default_feature_layers(30) == (2, 14)  # SmolLM2-135M
    assert default_feature_layers(4) == (1,)
    assert default_feature_layers(2) == ()


def test_a_short_training_context_keeps_features_of_the_whole_context(tmp_path):
    """head_context drops the head's early prompt positions, not the target's view of them:
    the kept rows equal the full-context features, fused streams RMS-normalised."""
    target_dir = make_tiny_model(tmp_path / "target", num_layers=4, seed=3)
    loaded = load_model(str(target_dir))
    target = build_model(loaded.config, loaded.state_dict, torch.float32)
    sample = Sample("k", [(5 * j) % 60 + 2 for j in range(30)], prompt_len=22)
    full, = featurize(target, [sample], None, (1,))
    short, = featurize(target, [sample], None, (1,), head_context=4)
    assert full.start == 21 and short.start == 4 and full.features.shape == (30, 128)
    assert short.token_ids == sample.token_ids[17:] and short.num_positions == 8
    assert torch.equal(short.features, full.features[17:])
    # Only the window's rows are kept: a view of them held the whole context's.
    assert short.features.untyped_storage().nbytes() == short.features.nbytes
    stream = full.features[:, 64:]  # layer 1's part of each row: unit RMS
    assert torch.allclose(stream.pow(2).mean(-1), torch.ones(30), atol=1e-4)


def _fake_seq(ids: list[int], window: int | None = None) -> EagleSeq:
    return EagleSeq(SimpleNamespace(params=SimpleNamespace(seed=None), all_token_ids=ids),
                    window)


def test_feature_buffer_fills_gaps_with_zeros_and_trims_the_oldest_rows():
    seq = _fake_seq(list(range(10)))
    seq.add_features(2, torch.ones(3, 4))  # positions 2, 3, 4
    seq.add_features(6, 2 * torch.ones(2, 4))  # positions 6, 7 (5 never computed)
    got = seq.features(-1, 9, 4, torch.float32)  # positions -1 .. 7
    assert got[:, 0].tolist() == [0, 0, 0, 1, 1, 1, 0, 2, 2]
    seq.drop_features_before(4)
    assert seq.features(-1, 9, 4, torch.float32)[:, 0].tolist() == [0, 0, 0, 0, 0, 1, 0, 2, 2]
    assert seq.num_pending == 3
    seq.max_pending = 4
    seq.add_features(8, 3 * torch.ones(2, 4))  # 5 rows > 4: only position 4 goes
    assert seq.num_pending == 4
    assert seq.features(4, 6, 4, torch.float32)[:, 0].tolist() == [0, 0, 2, 2, 3, 3]


def test_a_windowed_head_starts_over_on_its_window_and_keeps_only_its_features():
    """A head trained over 3 positions before the last computed one, 20 tokens behind: it
    catches up on 5 (the window, the last computed position, the newest token), reads a zero
    feature at its position 0 and the target's after, and keeps 5 feature rows (what the
    longest catch-up without a restart reads)."""
    ids = list(range(100, 120))
    seq = _fake_seq(ids, window=3)
    seq.add_features(0, torch.arange(19.0)[:, None].repeat(1, 2))  # positions 0 .. 18
    assert seq.num_pending == 5  # positions 14 .. 18
    assert seq.catch_up() == 5 and seq.restart_if_behind() and seq.offset == 15
    assert seq.num_tokens == 5 and len(seq.all_token_ids) == 5
    assert seq.all_token_ids[0:5] == ids[15:]
    assert seq.features(-1, 5, 2, torch.float32)[:, 0].tolist() == [0, 15, 16, 17, 18]
    seq.num_real = seq.num_computed_tokens = 5
    ids += [120, 121]
    assert seq.catch_up() == 2 and not seq.restart_if_behind()  # no further behind: no restart
    # window + 2 behind, the most without a restart: every position it runs over reads the
    # target's feature (with window + 1 rows kept, the first read a zero).
    ids += [122, 123, 124]
    seq.add_features(19, torch.arange(19.0, 24.0)[:, None].repeat(1, 2))
    assert seq.catch_up() == 5 and not seq.restart_if_behind()
    assert seq.features(4, 5, 2, torch.float32)[:, 0].tolist() == [19, 20, 21, 22, 23]
    del ids[-3:]
    ids += list(range(122, 130))
    assert seq.catch_up() == 5 and seq.restart_if_behind() and seq.offset == 25
    assert _fake_seq(ids[:4], window=3).catch_up() == 4  # a short prompt: all of it


@pytest.mark.parametrize("context,draft_every", [(3, 1), (6, 3)])
def test_a_windowed_head_guesses_in_the_engine_what_it_guesses_in_training(trained, tmp_path,
                                                                            context, draft_every):
    """A head served a window of positions (eagle.json's "context") guesses, position by
    position, what the dense head guesses over the same window of the features (featurize's
    head_context): the window the proposer serves is the one training builds. With
    draft_every > 1 the head sits out two steps of three, as under the adaptive policy, and
    reads the features of the steps it missed from the proposer's kept steps when it resumes."""
    target, outcome = trained
    path = shutil.copytree(outcome.path, tmp_path / "head")
    meta = json.loads((path / "eagle.json").read_text())
    meta["specserve_eagle"]["context"] = context
    (path / "eagle.json").write_text(json.dumps(meta))
    spec = LLM(str(target), dtype="float32", kv_cache_memory=KV, speculation_policy="static",
               speculative_config={"method": "eagle", "model": str(path),
                                   "num_speculative_tokens": 1})
    proposer = spec.engine.proposer
    assert proposer.model.context == context
    seen = record_first_guesses(proposer)
    if draft_every > 1:
        propose, calls = proposer.propose, [0]

        def sometimes(reqs, ks):
            calls[0] += 1
            # the first call drafts: the head starts on the window training starts it on
            return propose(reqs, ks if calls[0] % draft_every == 1 else [0] * len(ks))

        proposer.propose = sometimes
    head = outcome.result.head
    loaded = load_model(str(target))
    teacher = build_model(loaded.config, loaded.state_dict, torch.float32)
    checked = 0
    for it in outcome.result.held_out[:4]:
        sample = Sample(it.kind, it.token_ids, it.start + 1)
        windowed, = featurize(teacher, [sample], None, head.feature_layers,
                              head_context=context)
        seen.clear()
        spec.generate([it.token_ids[:it.start + 1]],
                      SamplingParams(temperature=0, max_tokens=it.num_positions))
        with torch.no_grad():
            pred, _ = head_outputs(head, [windowed])
            dense = head.to_full_ids(head.compute_logits(pred).argmax(dim=-1))
        assert seen and (it.start > context or draft_every > 1)  # the window cut the prompt
        for pos, guess in seen:
            assert guess == int(dense[pos - it.start]), pos
        checked += len(seen)
    assert checked >= 8
    if draft_every > 1:  # caught up on several kept steps at a time
        assert proposer.steps is not None and len(proposer.steps) == context + 2


def test_a_final_feature_only_head_and_one_saved_before_fused_features(trained, tmp_path):
    """feature_layers=() trains an EAGLE-1 head ([embedding | final feature] -> hidden); an
    eagle.json without "feature_layers" (heads saved before session 11) loads as one."""
    target, _ = trained
    cfg = EagleConfig(head_vocab=HEAD, minutes=1, max_steps=2, eval_every=2, batch_tokens=512,
                      feature_layers=(), show_progress=False)
    outcome = train_eagle_head(str(target), _items(12, seed=5), tmp_path / "head", cfg,
                               data_cfg=DataConfig(max_reply_tokens=8, dtype="float32"))
    assert load_file(str(outcome.path / "model.safetensors"))["fc.weight"].shape == (64, 128)
    meta_file = outcome.path / "eagle.json"
    meta = json.loads(meta_file.read_text())
    assert meta["specserve_eagle"].pop("feature_layers") == []
    meta_file.write_text(json.dumps(meta))
    prompts, params = _mixed_batch()
    ref = LLM(str(target), dtype="float32", kv_cache_memory=KV).generate(prompts, params)
    spec = _spec(target, outcome.path)
    assert spec.engine.runner.aux_layers == ()
    outs = spec.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in ref]
    assert spec.get_stats()["num_draft_tokens"] > 0


def test_head_for_another_target_is_refused(trained, tmp_path):
    target, outcome = trained
    other_weights = make_tiny_model(tmp_path / "seed7", num_layers=4, seed=7)
    with pytest.raises(ValueError, match="trained for a different target"):
        _spec(other_weights, outcome.path)
    other_hidden = make_tiny_model(tmp_path / "hidden32", num_layers=4, hidden_size=32)
    with pytest.raises(ValueError, match="trained for a different target"):
        _spec(other_hidden, outcome.path)
    shallow = make_tiny_model(tmp_path / "two_layers", num_layers=2, seed=3)
    with pytest.raises(ValueError, match="trained for a different target"):
        _spec(shallow, outcome.path)  # it has no layer 1 below its last for the head to read
    other_tok = shutil.copytree(target, tmp_path / "other_tok")
    tok = json.loads((other_tok / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    tok["model"]["vocab"] = {(k if k.startswith("<") else "v" + k[1:]): v
                             for k, v in vocab.items()}
    (other_tok / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ValueError, match="tokenizer does not match"):
        _spec(other_tok, outcome.path)
    with pytest.raises(ValueError, match="not an EAGLE head"):
        _spec(target, tmp_path)
    with pytest.raises(ValueError, match="needs \"model\""):
        LLM(str(target), dtype="float32", kv_cache_memory=KV,
            speculative_config={"method": "eagle"})
