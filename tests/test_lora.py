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
    return LLM(str(tiny["base"]), dtype="float32", kv_cache_memory=8 << 20, enable_lora=True,
               **kwargs)


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
    llm.generate(PROMPTS[:1], GREEDY, lora_request=tiny["b"])
    with pytest.raises(ValueError, match="already"):
        llm.generate(PROMPTS[:1], GREEDY, lora_request=LoRARequest("b2", 2, tiny["a"].lora_path))
    no_lora = LLM(str(tiny["base"]), dtype="float32", kv_cache_memory=8 << 20)
    with pytest.raises(ValueError, match="enable_lora"):
        no_lora.generate(PROMPTS[:1], GREEDY, lora_request=tiny["b"])
    assert not llm.engine.has_unfinished_requests()
    with pytest.raises(ValueError, match="lora_int_id"):
        LoRARequest("z", 0, "/nowhere")


# ---- the server ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tiny) -> Iterator[LiveServer]:
    live = LiveServer(str(tiny["base"]), "--dtype", "float32", "--kv-cache-memory", "8MiB",
                      "--num-threads", "1", "--enable-lora", "--allow-runtime-lora-updating",
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
    assert load("base", tiny["b"].lora_path).status_code == 400
    bad = load("d", str(tiny["root"]))  # no adapter_config.json there
    assert bad.status_code == 400 and "adapter_config.json" in bad.json()["error"]["message"]
    assert complete("a").status_code == 200
    unload = httpx.post(f"{server.url}/v1/unload_lora_adapter", json={"lora_name": "c"})
    assert unload.status_code == 200
    assert complete("c").status_code == 404
    assert httpx.post(f"{server.url}/v1/unload_lora_adapter",
                      json={"lora_name": "c"}).status_code == 404


def test_lora_modules_need_enable_lora(tiny):
    run = subprocess.run([sys.executable, "-m", "specserve.server.api_server",
                          str(tiny["base"]), "--lora-modules", f"a={tiny['a'].lora_path}"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "--lora-modules needs --enable-lora" in run.stderr
