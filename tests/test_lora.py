"""LoRA adapters (vLLM's enable_lora / LoRARequest / --lora-modules): PEFT adapters trained on a
tiny Hugging Face checkpoint, served in one batch with each other and the base model, give
PEFT's own greedy tokens; speculation stays lossless; cached prefixes are kept per adapter;
adapters that do not fit are refused by name; the server routes a request's `model` to its
adapter."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from test_server import LiveServer
from tiny_models import make_tiny_model

from specserve import LLM, LoRARequest, SamplingParams

peft = pytest.importorskip("peft")

PROMPTS = [[5, 9, 13, 2, 40], [7] * 11, list(range(2, 30))]
GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(base: Path, out: Path, seed: int, targets: list[str], r: int = 4, **config):
    """A PEFT LoRA adapter with random A and B (PEFT's default leaves B zero: no change), saved
    to out; returns the PEFT model for reference."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    torch.manual_seed(seed)
    lora = peft.LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets,
                           init_lora_weights=False, **config)
    model = peft.get_peft_model(model, lora)
    model.save_pretrained(out)
    return model.eval()


def hf_greedy(model, prompt: list[int]) -> list[int]:
    with torch.inference_mode():
        out = model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=20,
                             min_new_tokens=20, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict:
    """A tiny base model, two adapters (every projection at rank 4; q, v and down at rank 2)
    and the tokens PEFT's models generate greedily for PROMPTS."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("lora")
    base = make_tiny_model(root / "base", seed=3)
    a = make_adapter(base, root / "a", 1, ALL)
    b = make_adapter(base, root / "b", 2, ["q_proj", "v_proj", "down_proj"], r=2)
    plain = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    return {"root": root, "base": base,
            "a": LoRARequest("a", 1, str(root / "a")), "b": LoRARequest("b", 2, str(root / "b")),
            "expected": {name: [hf_greedy(m, p) for p in PROMPTS]
                         for name, m in (("a", a), ("b", b), (None, plain))}}


def engine(tiny: dict, **kwargs) -> LLM:
    return LLM(str(tiny["base"]), **{"dtype": "float32", "kv_cache_memory": 8 << 20,
                                     "enable_lora": True, **kwargs})


def tokens(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def test_adapters_and_the_base_model_in_one_batch_give_pefts_tokens(tiny):
    outs = engine(tiny).generate(PROMPTS * 3, GREEDY,
                                 lora_request=[tiny["a"]] * 3 + [None] * 3 + [tiny["b"]] * 3)
    got = tokens(outs)
    assert got[:3] == tiny["expected"]["a"]
    assert got[3:6] == tiny["expected"][None]
    assert got[6:] == tiny["expected"]["b"]
    assert got[:3] != got[3:6] and got[6:] != got[3:6]  # each adapter changes the output


def test_requests_of_one_adapter_apart_in_the_batch(tiny):
    """Interleaved, each adapter's rows are several ranges of the flat batch: gathered and
    scattered back (LoRABatch's index path), not one slice."""
    loras = [tiny["a"], None, tiny["b"]] * 3
    prompts = [p for p in PROMPTS for _ in range(3)]
    got = tokens(engine(tiny).generate(prompts, GREEDY, lora_request=loras))
    for k, (p, lora) in enumerate(zip(prompts, loras, strict=True)):
        name = None if lora is None else lora.lora_name
        assert got[k] == tiny["expected"][name][PROMPTS.index(p)]


@pytest.mark.parametrize("max_loras", [1, 2])
def test_max_loras_bounds_the_adapters_of_a_step(tiny, monkeypatch, max_loras):
    # vLLM's max_loras: a request whose adapter would exceed it waits; tokens are unchanged.
    from specserve.lora.batch import LoRABatch

    widths = []
    build = LoRABatch.build.__func__

    def counting(cls, spans, device):
        widths.append(len({id(a) for a, s, e in spans if a is not None and e > s}))
        return build(cls, spans, device)

    monkeypatch.setattr(LoRABatch, "build", classmethod(counting))
    loras = [tiny["a"], None, tiny["b"]] * 3
    prompts = [p for p in PROMPTS for _ in range(3)]
    got = tokens(engine(tiny, max_loras=max_loras).generate(prompts, GREEDY, lora_request=loras))
    for k, (p, lora) in enumerate(zip(prompts, loras, strict=True)):
        name = None if lora is None else lora.lora_name
        assert got[k] == tiny["expected"][name][PROMPTS.index(p)]
    assert max(widths) == max_loras  # 2 is reached: the limit, not chance, kept it at 1


def test_a_request_held_by_max_loras_lets_the_less_urgent_pass(tiny):
    # Under priority scheduling a wait stops less urgent requests from passing; one for an
    # adapter slot would hold them for as long as other adapters run (vLLM skips it).
    from specserve.engine.request import RequestStatus

    llm = engine(tiny, max_loras=1, scheduling_policy="priority")
    eng = llm.engine
    first = eng.add_request(PROMPTS[0], GREEDY, lora_request=tiny["a"], priority=0)
    eng.step()
    held = eng.add_request(PROMPTS[1], GREEDY, lora_request=tiny["b"], priority=0)
    base = eng.add_request(PROMPTS[2], GREEDY, priority=1)
    eng.step()
    assert first.status == base.status == RequestStatus.RUNNING
    assert held.status == RequestStatus.WAITING and eng.scheduler.waiting[0] is held
    while eng.has_unfinished_requests():
        eng.step()
    assert held.output_token_ids == tiny["expected"]["b"][1]


def test_lora_batch_adds_each_rows_own_update():
    """LoRABatch against a row-by-row reference: slices, gathered rows, rows of no adapter."""
    from specserve.lora.adapter import LoRAAdapter, LoRALinear
    from specserve.lora.batch import LoRABatch

    torch.manual_seed(0)

    def adapter(i: int) -> LoRAAdapter:
        update = LoRALinear(torch.randn(8, 3), torch.randn(3, 5))
        return LoRAAdapter(LoRARequest(f"x{i}", i, "/x"), 3, [{"o_proj": update}], 0)

    a, b = adapter(1), adapter(2)
    spans = [(a, 0, 2), (None, 2, 3), (b, 3, 4), (a, 4, 7), (b, 7, 7), (None, 7, 9)]
    batch = LoRABatch.build(spans, torch.device("cpu"))
    x, y = torch.randn(9, 8), torch.randn(9, 5)
    expected = y.clone()
    for adapter_, start, end in spans:
        if adapter_ is not None:
            u = adapter_.layers[0]["o_proj"]
            expected[start:end] += x[start:end] @ u.a @ u.b
    torch.testing.assert_close(batch.add(y.clone(), x, 0, "o_proj"), expected)
    assert torch.equal(batch.add(y.clone(), x, 0, "qkv_proj"), y)  # no update for that linear
    assert LoRABatch.build([(None, 0, 9)], torch.device("cpu")) is None


def test_rslora_rank_pattern_and_qwen_give_pefts_tokens(tiny, tmp_path):
    """rsLoRA's alpha / sqrt(r), a rank per module, Qwen2 (q/k/v biases the update leaves
    alone) and Qwen3 (q/k norms after the update)."""
    out = tmp_path / "rs"
    model = make_adapter(tiny["base"], out, 4, ALL, r=4, use_rslora=True,
                         rank_pattern={"q_proj": 2, "down_proj": 1})
    got = tokens(engine(tiny).generate(PROMPTS, GREEDY,
                                       lora_request=LoRARequest("rs", 9, str(out))))
    assert got == [hf_greedy(model, p) for p in PROMPTS]
    for arch in ("qwen2", "qwen3"):
        qwen = make_tiny_model(tmp_path / arch, arch=arch, seed=5)
        model = make_adapter(qwen, tmp_path / f"{arch}-lora", 6, ALL, r=4)
        llm = LLM(str(qwen), dtype="float32", kv_cache_memory=8 << 20, enable_lora=True)
        got = tokens(llm.generate(PROMPTS, GREEDY, lora_request=LoRARequest(
            "q", 1, str(tmp_path / f"{arch}-lora"))))
        assert got == [hf_greedy(model, p) for p in PROMPTS]


def test_chunked_prefill_and_preemption_keep_the_adapter(tiny):
    """8-token prefill chunks and a pool of 6 blocks for three 48-token sequences: requests are
    prefilled in pieces and preempted, and each still gets its adapter's tokens."""
    llm = engine(tiny, long_prefill_token_threshold=8, kv_cache_memory=6 * 16 * 512,
                 enable_prefix_caching=False)
    assert llm.engine.block_manager.num_blocks == 6
    loras = [tiny["a"], tiny["b"], tiny["a"]]
    prompts = [PROMPTS[2], PROMPTS[2], PROMPTS[1]]
    got = tokens(llm.generate(prompts, GREEDY, lora_request=loras))
    assert llm.get_stats()["num_preemptions"] > 0
    assert got == [tiny["expected"]["a"][2], tiny["expected"]["b"][2], tiny["expected"]["a"][1]]


@pytest.mark.parametrize("quantization", [None, "int8", "int4"])
def test_a_zero_update_leaves_any_base_unchanged(tiny, tmp_path, quantization):
    """PEFT's default initialisation (B = 0) changes nothing: a step with adapter rows runs
    the layers in Python, not the C++ layer loop, and must give the base engine's tokens, bf16
    and quantized alike."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny["base"], dtype=torch.float32)
    peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=ALL)).save_pretrained(
        tmp_path / "zero")
    llm = LLM(str(tiny["base"]), dtype="bfloat16", kv_cache_memory=8 << 20, enable_lora=True,
              quantization=quantization)
    base = tokens(llm.generate(PROMPTS, GREEDY))
    zero = LoRARequest("zero", 1, str(tmp_path / "zero"))
    assert tokens(llm.generate(PROMPTS, GREEDY, lora_request=zero)) == base


@pytest.mark.parametrize("spec", [{"method": "ngram", "num_speculative_tokens": 3},
                                  "draft"], ids=["ngram", "draft-model"])
def test_speculation_stays_lossless_under_an_adapter(tiny, spec):
    """The drafts come from the base model (n-gram, or the base checkpoint as a draft model);
    verification runs the adapter, so the tokens are the adapter's."""
    if spec == "draft":
        spec = {"method": "draft", "model": str(tiny["base"]), "num_speculative_tokens": 3}
    llm = engine(tiny, speculative_config=spec, speculation_policy="static")
    prompts = [[5, 6, 7, 8] * 4, *PROMPTS]
    loras = [tiny["a"], tiny["a"], None, tiny["b"]]
    outs = llm.generate(prompts, GREEDY, lora_request=loras)
    plain = engine(tiny).generate(prompts, GREEDY, lora_request=loras)
    assert tokens(outs) == tokens(plain)
    assert tokens(outs)[1] == tiny["expected"]["a"][0]
    assert llm.get_stats()["num_draft_tokens"] > 0


def test_a_cached_prefix_serves_only_its_own_adapter(tiny):
    llm = engine(tiny)
    prompt = list(range(2, 50))  # three full blocks of 16
    first = tokens(llm.generate([prompt], GREEDY, lora_request=tiny["a"]))
    hits = llm.get_stats()["prefix_cache_hits"]
    base = tokens(llm.generate([prompt], GREEDY))
    assert llm.get_stats()["prefix_cache_hits"] == hits  # the adapter's KV is not the base's
    other = tokens(llm.generate([prompt], GREEDY, lora_request=tiny["b"]))
    assert llm.get_stats()["prefix_cache_hits"] == hits
    again = tokens(llm.generate([prompt], GREEDY, lora_request=tiny["a"]))
    assert llm.get_stats()["prefix_cache_hits"] > hits
    fresh = engine(tiny, enable_prefix_caching=False)
    assert again == first == tokens(fresh.generate([prompt], GREEDY, lora_request=tiny["a"]))
    assert base == tokens(fresh.generate([prompt], GREEDY))
    assert other == tokens(fresh.generate([prompt], GREEDY, lora_request=tiny["b"]))


def test_an_id_given_to_other_weights_is_not_served_the_old_adapters_kv(tiny):
    llm = engine(tiny)
    prompt = list(range(2, 50))
    llm.generate([prompt], GREEDY, lora_request=tiny["a"])
    assert llm.engine.remove_lora(1)
    as_b = LoRARequest("b", 1, tiny["b"].lora_path)  # the id a had, b's weights
    hits = llm.get_stats()["prefix_cache_hits"]
    got = tokens(llm.generate([prompt], GREEDY, lora_request=as_b))
    assert llm.get_stats()["prefix_cache_hits"] == hits
    assert got == tokens(engine(tiny).generate([prompt], GREEDY, lora_request=tiny["b"]))


def test_the_server_path_never_reads_an_adapter_on_the_engine_thread(tiny):
    """An adapter unloaded while a request for it waited is refused, not read from disk by the
    engine thread (every running request would wait for it)."""
    llm = engine(tiny)
    with pytest.raises(ValueError, match="not loaded"):
        llm.engine.add_request(PROMPTS[0], GREEDY, lora_request=tiny["a"], load_lora=False)
    assert llm.engine.list_loras() == set()
    llm.engine.add_lora(tiny["a"])
    llm.engine.add_request(PROMPTS[0], GREEDY, lora_request=tiny["a"], load_lora=False)
    # Unloaded, and its id given to other weights before the request reached the engine: the
    # request is refused, not run with them.
    llm.engine.remove_lora(tiny["a"].lora_int_id)
    llm.engine.add_lora(LoRARequest("x", tiny["a"].lora_int_id, tiny["b"].lora_path))
    with pytest.raises(ValueError, match="not loaded"):
        llm.engine.add_request(PROMPTS[0], GREEDY, lora_request=tiny["a"], load_lora=False)


def _write_config(path: Path, **changes) -> None:
    conf = json.loads((path / "adapter_config.json").read_text())
    (path / "adapter_config.json").write_text(json.dumps(conf | changes))


def test_adapters_that_do_not_fit_are_refused_by_name(tiny, tmp_path):
    llm = engine(tiny, max_lora_rank=2)
    with pytest.raises(ValueError, match="rank 4 .* over max_lora_rank 2"):
        llm.generate(PROMPTS[:1], GREEDY, lora_request=tiny["a"])
    other = make_tiny_model(tmp_path / "other", seed=1, hidden_size=32)
    make_adapter(other, tmp_path / "other-lora", 1, ["q_proj"])
    with pytest.raises(ValueError, match="does not fit this model"):
        llm.generate(PROMPTS[:1], GREEDY,
                     lora_request=LoRARequest("x", 3, str(tmp_path / "other-lora")))
    make_adapter(tiny["base"], tmp_path / "head", 1, ["q_proj", "lm_head"], r=2)
    with pytest.raises(ValueError, match="lm_head.* not an update specserve applies"):
        llm.generate(PROMPTS[:1], GREEDY, lora_request=LoRARequest("h", 4, str(tmp_path / "head")))
    make_adapter(tiny["base"], tmp_path / "dora", 1, ["q_proj"], r=2, use_dora=True)
    with pytest.raises(ValueError, match="use_dora"):
        llm.generate(PROMPTS[:1], GREEDY, lora_request=LoRARequest("d", 5, str(tmp_path / "dora")))
    make_adapter(tiny["base"], tmp_path / "saved", 1, ["q_proj"], r=2)
    _write_config(tmp_path / "saved", modules_to_save=["lm_head"])
    with pytest.raises(ValueError, match="modules_to_save"):
        llm.generate(PROMPTS[:1], GREEDY,
                     lora_request=LoRARequest("s", 6, str(tmp_path / "saved")))
    with pytest.raises(ValueError, match="no adapter_config.json"):
        llm.generate(PROMPTS[:1], GREEDY, lora_request=LoRARequest("n", 7, str(tmp_path)))
    make_adapter(tiny["base"], tmp_path / "ga", 1, ["q_proj"], r=2)
    _write_config(tmp_path / "ga", init_lora_weights="lora_ga")
    with pytest.raises(ValueError, match="changes the base weights"):
        llm.generate(PROMPTS[:1], GREEDY, lora_request=LoRARequest("g", 8, str(tmp_path / "ga")))
    weights = tmp_path / "saved" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated
    _write_config(tmp_path / "saved", modules_to_save=None)
    with pytest.raises(ValueError, match="cannot read adapter_model.safetensors"):
        llm.generate(PROMPTS[:1], GREEDY,
                     lora_request=LoRARequest("t", 9, str(tmp_path / "saved")))
    # What raised other errors (a 500 on the server): rank 0, a NaN alpha, a .bin of other
    # things than 2-D tensors by name, a home directory that does not exist.
    from safetensors.torch import load_file, save_file
    zero = {k: t[:0] if "lora_A" in k else t[:, :0]
            for k, t in load_file(str(Path(tiny["a"].lora_path) / "adapter_model.safetensors"))
            .items()}
    make_adapter(tiny["base"], tmp_path / "r0", 1, ["q_proj"], r=2)
    save_file(zero, str(tmp_path / "r0" / "adapter_model.safetensors"))
    make_adapter(tiny["base"], tmp_path / "nan", 1, ["q_proj"], r=2)
    _write_config(tmp_path / "nan", lora_alpha=float("nan"))
    make_adapter(tiny["base"], tmp_path / "bin", 1, ["q_proj"], r=2)
    (tmp_path / "bin" / "adapter_model.safetensors").unlink()
    torch.save({"base_model.model.layers.0.self_attn.q_proj.lora_A.weight": 3},
               tmp_path / "bin" / "adapter_model.bin")
    for i, (where, error) in enumerate([
            (tmp_path / "r0", "does not fit this model"), (tmp_path / "nan", "finite number"),
            (tmp_path / "bin", "2-D float tensors"), ("~no-such-user-here/x", "no-such-user")]):
        with pytest.raises(ValueError, match=error):
            llm.generate(PROMPTS[:1], GREEDY, lora_request=LoRARequest("e", 20 + i, str(where)))
    with pytest.raises(ValueError, match="must be a LoRARequest"):
        llm.generate(PROMPTS[:1], GREEDY, lora_request="b")
    with pytest.raises(ValueError, match="maximum context"):  # refused before it loads
        llm.generate([[5] * 300], GREEDY, lora_request=LoRARequest("l", 10, tiny["a"].lora_path))
    assert 10 not in llm.engine.list_loras()
    llm.generate(PROMPTS[:1], GREEDY, lora_request=tiny["b"])
    with pytest.raises(ValueError, match="already"):
        llm.generate(PROMPTS[:1], GREEDY, lora_request=LoRARequest("b2", 2, tiny["a"].lora_path))
    no_lora = LLM(str(tiny["base"]), dtype="float32", kv_cache_memory=8 << 20)
    with pytest.raises(ValueError, match="enable_lora"):
        no_lora.generate(PROMPTS[:1], GREEDY, lora_request=tiny["b"])
    assert not llm.engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="lora_int_id"):
        LoRARequest("z", 0, "/nowhere")


def test_a_beam_search_takes_an_adapter_per_prompt(tiny):
    # As vLLM's LLM.beam_search (a list raised AttributeError).
    from specserve.beam_search import BeamSearchParams

    llm = engine(tiny)
    params = BeamSearchParams(beam_width=2, max_tokens=6, ignore_eos=True)
    both = llm.beam_search(PROMPTS[:2], params, lora_request=[tiny["a"], None])
    alone = [llm.beam_search(PROMPTS[:1], params, lora_request=tiny["a"])[0],
             llm.beam_search(PROMPTS[1:2], params)[0]]
    assert [[s.tokens for s in o.sequences] for o in both] == \
        [[s.tokens for s in o.sequences] for o in alone]
    assert both[0].sequences[0].tokens != llm.beam_search(PROMPTS[:1], params)[0] \
        .sequences[0].tokens
    with pytest.raises(ValueError, match="one lora_request per prompt"):
        llm.beam_search(PROMPTS[:2], params, lora_request=[tiny["a"]])


def test_an_adapter_without_the_memory_for_it_is_refused(tiny, monkeypatch):
    # An out-of-memory load was a 500 on the server (only ValueError is the client's).
    import specserve.engine.llm_engine as llm_engine

    llm = engine(tiny)
    llm.generate(PROMPTS[:1], GREEDY, lora_request=tiny["a"])

    def no_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(llm_engine, "load_adapter", no_memory)
    with pytest.raises(ValueError, match="not enough memory"):
        llm.generate(PROMPTS[:1], GREEDY, lora_request=tiny["b"])
    assert llm.engine.list_loras() == {1}
    assert tokens(llm.generate(PROMPTS[:1], GREEDY, lora_request=tiny["a"])) == \
        tiny["expected"]["a"][:1]


# ---- the server ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tiny) -> Iterator[LiveServer]:
    live = LiveServer(str(tiny["base"]), "--dtype", "float32", "--kv-cache-memory", "8MiB",
                      "--num-threads", "1", "--chat-template",
                      "{% for m in messages %}{{ m['content'] }} {% endfor %}",
                      "--enable-lora", "--allow-runtime-lora-updating",
                      "--lora-modules",
                      f"a={tiny['a'].lora_path}",
                      json.dumps({"name": "b", "path": tiny["b"].lora_path}))
    yield live
    live.stop()


def test_the_server_runs_the_adapter_a_request_names(server, tiny):
    models = httpx.get(f"{server.url}/v1/models").json()["data"]
    assert [(m["id"], m["parent"]) for m in models] == [("base", None), ("a", "base"),
                                                          ("b", "base")]
    for name, i in (("a", 0), ("b", 2), ("base", 1)):
        reply = httpx.post(f"{server.url}/v1/completions", timeout=60, json={
            "model": name, "prompt": PROMPTS[i], "max_tokens": 20, "temperature": 0,
            "ignore_eos": True, "logprobs": 0, "return_tokens_as_token_ids": True})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["model"] == name
        ids = [int(t.split(":")[1]) for t in body["choices"][0]["logprobs"]["tokens"]]
        assert ids == tiny["expected"][None if name == "base" else name][i]
    streamed = httpx.post(f"{server.url}/v1/completions", timeout=60, json={
        "model": "a", "prompt": PROMPTS[0], "max_tokens": 4, "stream": True})
    assert streamed.status_code == 200 and '"model":"a"' in streamed.text
    missing = httpx.post(f"{server.url}/v1/completions", timeout=60,
                         json={"model": "c", "prompt": PROMPTS[0]})
    assert missing.status_code == 404


def test_chat_and_responses_run_the_named_adapter(server, tiny):
    """The template renders "w5 w9 w13 w2 w40 " as PROMPTS[0]'s tokens; chat and the Responses
    API route by model as completions do."""
    text = " ".join(f"w{t}" for t in PROMPTS[0])
    replies = {}
    for name in ("a", "base"):
        chat = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
            "model": name, "messages": [{"role": "user", "content": text}], "max_tokens": 8,
            "temperature": 0, "ignore_eos": True})
        assert chat.status_code == 200 and chat.json()["model"] == name
        replies[name] = chat.json()["choices"][0]["message"]["content"]
        resp = httpx.post(f"{server.url}/v1/responses", timeout=60, json={
            "model": name, "input": text, "max_output_tokens": 8, "temperature": 0})
        assert resp.status_code == 200 and resp.json()["model"] == name
    assert replies["a"] != replies["base"]
    streamed = httpx.post(f"{server.url}/v1/chat/completions", timeout=60, json={
        "model": "a", "messages": [{"role": "user", "content": text}], "max_tokens": 8,
        "temperature": 0, "ignore_eos": True, "stream": True})
    chunks = [json.loads(line[6:]) for line in streamed.text.splitlines()
              if line.startswith("data: {")]
    assert {c["model"] for c in chunks} == {"a"}
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == replies["a"]


def test_adapters_load_and_unload_at_run_time(server, tiny):
    """vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter: a loaded adapter serves
    requests by its name, a bad one is a 400 that leaves the server serving, an unloaded one is
    a 404 again."""
    def load(name: str, path: str) -> httpx.Response:
        return httpx.post(f"{server.url}/v1/load_lora_adapter", timeout=60,
                          json={"lora_name": name, "lora_path": path})

    def complete(name: str) -> httpx.Response:
        return httpx.post(f"{server.url}/v1/completions", timeout=60, json={
            "model": name, "prompt": PROMPTS[0], "max_tokens": 20, "temperature": 0,
            "ignore_eos": True, "logprobs": 0, "return_tokens_as_token_ids": True})

    assert load("c", tiny["a"].lora_path).status_code == 200
    body = complete("c").json()
    ids = [int(t.split(":")[1]) for t in body["choices"][0]["logprobs"]["tokens"]]
    assert ids == tiny["expected"]["a"][0] and body["model"] == "c"
    assert "c" in [m["id"] for m in httpx.get(f"{server.url}/v1/models").json()["data"]]
    assert load("c", tiny["b"].lora_path).status_code == 400  # the name is taken
    # vLLM's load_inplace: the name now serves the other weights.
    reload = httpx.post(f"{server.url}/v1/load_lora_adapter", timeout=60, json={
        "lora_name": "c", "lora_path": tiny["b"].lora_path, "load_inplace": True})
    assert reload.status_code == 200, reload.text
    body = complete("c").json()
    assert [int(t.split(":")[1]) for t in body["choices"][0]["logprobs"]["tokens"]] == \
        tiny["expected"]["b"][0]
    missing = load("m", str(tiny["root"] / "nowhere"))
    assert missing.status_code == 404 and "No adapter found" in missing.json()["error"]["message"]
    assert load("base", tiny["b"].lora_path).status_code == 400
    bad = load("d", str(tiny["root"]))  # no adapter_config.json there
    assert bad.status_code == 400 and "adapter_config.json" in bad.json()["error"]["message"]
    assert complete("a").status_code == 200
    unload = httpx.post(f"{server.url}/v1/unload_lora_adapter", json={"lora_name": "c"})
    assert unload.status_code == 200
    assert complete("c").status_code == 404
    assert httpx.post(f"{server.url}/v1/unload_lora_adapter",
                      json={"lora_name": "c"}).status_code == 404
    # With none left, as on a server started without --lora-modules (that load was a 500).
    for name in ("a", "b"):
        assert httpx.post(f"{server.url}/v1/unload_lora_adapter",
                          json={"lora_name": name}).status_code == 200
    assert httpx.get(f"{server.url}/v1/models").json()["data"][1:] == []
    assert load("a", tiny["a"].lora_path).status_code == 200
    assert load("b", tiny["b"].lora_path).status_code == 200
    body = complete("a").json()
    assert [int(t.split(":")[1]) for t in body["choices"][0]["logprobs"]["tokens"]] == \
        tiny["expected"]["a"][0]


def test_a_beam_search_keeps_its_adapter_when_it_is_unloaded(server, tiny):
    """Every step of a beam search is an engine request of its own: unloaded midway, the
    adapter stays in the engine until the search ends (its next step was a 400), and only
    new requests are refused."""
    from concurrent.futures import ThreadPoolExecutor

    from test_server import wait_until

    done = "vllm:request_success_total{finished_reason=length}"
    # Long (240 steps of 8 beams, ~1 s here) so that the unload lands midway; tried again
    # where a loaded machine ran the whole search first.
    body = {"model": "e", "prompt": PROMPTS[0], "max_tokens": 240, "ignore_eos": True, "n": 8,
            "use_beam_search": True}
    with ThreadPoolExecutor(1) as pool:
        for _ in range(3):
            assert httpx.post(f"{server.url}/v1/load_lora_adapter", timeout=60, json={
                "lora_name": "e", "lora_path": tiny["a"].lora_path}).status_code == 200
            before = server.metrics().get(done, 0)
            search = pool.submit(httpx.post, f"{server.url}/v1/completions", json=body,
                                 timeout=60)
            assert wait_until(lambda b=before: server.metrics().get(done, 0) > b)  # a step ran
            unload = httpx.post(f"{server.url}/v1/unload_lora_adapter", json={"lora_name": "e"})
            assert unload.status_code == 200
            midway = not search.done()
            reply = search.result()
            if midway:
                break
        assert midway
    assert reply.status_code == 200, reply.text
    assert [c["finish_reason"] for c in reply.json()["choices"]] == ["length"] * 8
    assert httpx.post(f"{server.url}/v1/completions", json=body).status_code == 404


@pytest.mark.parametrize(("flags", "error"), [
    (["--lora-modules", "a=A"], "--lora-modules needs --enable-lora"),
    (["--enable-lora", "--lora-modules", "base=A"], "is the base model's name"),
    (["--enable-lora", "--lora-modules", "a=ROOT"], "no adapter_config.json"),
], ids=["without-enable-lora", "the-base-name", "not-an-adapter"])
def test_a_server_with_adapters_it_cannot_serve_does_not_start(tiny, flags, error):
    flags = [f.replace("A", tiny["a"].lora_path) if f.endswith("=A") else
             f.replace("ROOT", str(tiny["root"])) for f in flags]
    run = subprocess.run([sys.executable, "-m", "specserve.server.api_server",
                          str(tiny["base"]), "--dtype", "float32", "--kv-cache-memory", "8MiB",
                          "--port", "0", *flags], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and error in run.stderr
    assert "Traceback" not in run.stderr
