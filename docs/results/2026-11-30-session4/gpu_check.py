"""The CUDA path on a lent GPU, with randomly initialised weights of real shapes (no weights can
travel to that machine). Each section records its figures or its traceback in gpu_check.json, so
one run tells everything that works and everything that does not.

    python gpu_check.py TOKENIZER_DIR OUT_DIR [--device cuda] [--tiny]

TOKENIZER_DIR: the embedded model's tokenizer (save_pretrained of SmolLM2-135M-Instruct's).
--tiny --device cpu: a dry run of the script itself on small shapes (minutes on 2 CPU cores).

Sections: greedy agreement with Hugging Face transformers (fp32, SmolLM2-135M shape); greedy
losslessness of n-gram and draft-model speculation; each quantized linear against bf16 (error,
time); the engine end to end with quantized weights and 8-bit KV; forward time against the
number of tokens (the cost model's profile) and closed-loop throughput at concurrency 1 / 32 / 64
for off, n-gram, draft and adaptive on the SmolLM2-1.7B shape with a SmolLM2-135M-shaped draft.
Random weights make acceptance meaningless (near zero for the draft); what the timing measures is
speculation's cost, and whether the adaptive policy avoids paying it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
import traceback
from pathlib import Path

import torch

COMMON = dict(vocab_size=49152, max_position_embeddings=8192, rms_norm_eps=1e-5,
              bos_token_id=1, eos_token_id=2, hidden_act="silu", tie_word_embeddings=True)
SHAPES = {
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, rope_theta=100000.0),
    "smollm2-1.7b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24,
                         num_attention_heads=32, num_key_value_heads=32, rope_theta=130000.0),
}
TINY_LAYERS = {"smollm2-135m": 4, "smollm2-1.7b": 2}
PROMPTS = ["The capital of France is", "def fibonacci(n):", "SELECT name FROM users WHERE",
           "Once upon a time, in a land far away,", "{\"name\": \"Ada\", \"age\":",
           "Speculative decoding works by", "The three laws of robotics are",
           "import numpy as np\nx = np.arange(10)\n"]

results: dict = {}


def save(out: Path) -> None:
    (out / "gpu_check.json").write_text(json.dumps(results, indent=1, default=str) + "\n")


ONLY: set[str] | None = None


def section(name: str, out: Path):
    def wrap(fn):
        if ONLY is not None and name not in ONLY:
            return fn
        t0 = time.perf_counter()
        print(f"=== {name}", flush=True)
        try:
            results[name] = {"ok": True, **fn()}
        except Exception as exc:  # record and go on: one run must tell as much as it can
            results[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                             "traceback": traceback.format_exc()[-3000:]}
        results[name]["seconds"] = round(time.perf_counter() - t0, 1)
        print(json.dumps(results[name], default=str)[:3000], flush=True)
        save(out)
        return fn
    return wrap


def make_model(name: str, tok: Path, root: Path, device: str, tiny: bool) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = dict(SHAPES[name])
    if tiny:
        shape["num_hidden_layers"] = TINY_LAYERS[name]
    path = root / name
    if path.exists():
        return path
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(LlamaConfig(**COMMON, **shape))
    model.to(torch.bfloat16).save_pretrained(str(path))
    for f in tok.iterdir():
        shutil.copy(f, path / f.name)
    del model
    return path


def greedy_ids(llm, prompts, max_tokens: int) -> list[list[int]]:
    from specserve import SamplingParams

    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                                ignore_eos=True))
    return [list(o.outputs[0].token_ids) for o in outs]


def first_divergence(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                None if len(a) == len(b) else min(len(a), len(b)))


def free(*objs) -> None:
    import gc

    del objs
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("tokenizer", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--models", type=Path, default=Path("/tmp/gpu_check_models"))
    ap.add_argument("--only", default=None, help="comma-separated section names to run")
    ap.add_argument("--order", default="off,ngram-static,draft-static,adaptive-draft",
                    help="throughput strategies, in the order they run (repeats allowed)")
    ap.add_argument("--concurrency", default=None)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dev, out = args.device, args.out
    global ONLY
    ONLY = set(args.only.split(",")) if args.only else None
    from specserve import LLM

    @section("environment", out)
    def _env():
        info = {"torch": torch.__version__, "device": dev}
        if torch.cuda.is_available():
            info.update(gpu=torch.cuda.get_device_name(0),
                        capability=torch.cuda.get_device_capability(0),
                        memory_gib=torch.cuda.get_device_properties(0).total_memory / 2**30)
        import transformers
        info["transformers"] = transformers.__version__
        return info

    small = make_model("smollm2-135m", args.tokenizer, args.models, dev, args.tiny)

    @section("greedy_vs_transformers", out)
    def _hf():
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(small))
        res = {}
        for dtype in ("float32", "bfloat16"):
            llm = LLM(str(small), device=dev, dtype=dtype, kv_cache_memory=1 << 30)
            ours = greedy_ids(llm, PROMPTS, 32)
            free(llm)
            hf = AutoModelForCausalLM.from_pretrained(str(small), dtype=getattr(torch, dtype)
                                                      ).to(dev).eval()
            theirs = []
            for p in PROMPTS:
                ids = torch.tensor([tok(p, add_special_tokens=False).input_ids], device=dev)
                g = hf.generate(ids, max_new_tokens=32, min_new_tokens=32, do_sample=False)
                theirs.append(g[0, ids.shape[1]:].tolist())
            free(hf)
            div = [first_divergence(a, b) for a, b in zip(ours, theirs, strict=True)]
            res[dtype] = {"identical": sum(d is None for d in div), "of": len(PROMPTS),
                          "first_divergence": div}
        return res

    @section("speculation_lossless_fp32", out)
    def _spec():
        from specserve.spec_decode.eagle_head import EagleHead
        from specserve.spec_decode.eagle_io import save_eagle

        base = LLM(str(small), device=dev, dtype="float32", kv_cache_memory=1 << 30)
        want = greedy_ids(base, PROMPTS, 40)
        # An untrained EAGLE head (random fc and layer) on the target's embedding and LM head.
        m = base.engine.model
        torch.manual_seed(0)
        head = EagleHead(base.engine.model_config, m.embed_tokens, m.embed_tokens.weight, None,
                         torch.float32).to(dev)
        eagle_dir = args.models / "eagle-random"
        save_eagle(eagle_dir, head, "random", base.get_tokenizer(), {})
        free(base, head)
        res = {}
        cfgs = {"eagle": {"method": "eagle", "model": str(eagle_dir),
                          "num_speculative_tokens": 3},
                "ngram": {"method": "ngram", "num_speculative_tokens": 3},
                "draft-self-2-layers": {"method": "draft", "draft_layers": 2,
                                        "num_speculative_tokens": 3},
                "draft-separate-model": {"method": "draft", "model": str(small),
                                         "num_speculative_tokens": 4}}
        for name, cfg in cfgs.items():
            llm = LLM(str(small), device=dev, dtype="float32", kv_cache_memory=1 << 30,
                      speculative_config=cfg, speculation_policy="static")
            got = greedy_ids(llm, PROMPTS, 40)
            stats = llm.engine.get_stats()
            # a seeded sampled request must run too (rejection sampling on host probabilities)
            from specserve import SamplingParams
            llm.generate(PROMPTS[:2], SamplingParams(temperature=0.8, seed=1, max_tokens=16))
            free(llm)
            same = sum(a == b for a, b in zip(got, want, strict=True))
            res[name] = {"identical": same, "of": len(want),
                         "drafted": stats["num_draft_tokens"],
                         "acceptance": stats["acceptance_rate"]}
        return res

    @section("quantized_linears", out)
    def _quant():
        from torch import nn

        from specserve.quant.swap import quantize_model

        shapes = [(576, 1536), (1536, 576), (2048, 8192), (8192, 2048), (4096, 14336)]
        if args.tiny:
            shapes = shapes[:2]
        res = []
        for k, n in shapes:
            torch.manual_seed(0)
            ref = nn.Linear(k, n, bias=False, dtype=torch.bfloat16, device=dev)
            for method in ("int8", "int4", "fp8"):
                row = {"in": k, "out": n, "method": method}
                try:
                    q = quantize_model(nn.Sequential(_copy(ref)), method)[0]
                    row["module"] = type(q).__name__
                    row["path"] = getattr(q, "layout", None) or getattr(q, "kernel", None)
                    for m in (1, 32):
                        x = torch.randn(m, k, dtype=torch.bfloat16, device=dev)
                        with torch.no_grad():
                            y, yq = ref(x).float(), q(x).float()
                        row[f"rel_err_m{m}"] = ((yq - y).norm() / y.norm()).item()
                        row[f"us_m{m}"] = _time_us(q, x, dev)
                        row[f"bf16_us_m{m}"] = _time_us(ref, x, dev)
                except Exception as exc:
                    row["error"] = f"{type(exc).__name__}: {exc}"
                res.append(row)
        return {"rows": res}

    @section("engine_quantized", out)
    def _engine_quant():
        base = LLM(str(small), device=dev, kv_cache_memory=1 << 30)
        want = greedy_ids(base, PROMPTS[:4], 16)
        free(base)
        res = {}
        for kw in ({"quantization": "int8"}, {"quantization": "int4"}, {"quantization": "fp8"},
                   {"kv_cache_dtype": "int8"}, {"kv_cache_dtype": "fp8_e4m3"}):
            key = ",".join(f"{k}={v}" for k, v in kw.items())
            try:
                llm = LLM(str(small), device=dev, kv_cache_memory=1 << 30, **kw)
                got = greedy_ids(llm, PROMPTS[:4], 16)
                st = llm.engine.get_stats()
                free(llm)
                res[key] = {"first_divergence_vs_bf16": [first_divergence(a, b)
                                                         for a, b in zip(got, want, strict=True)],
                            "weight_mib": st["weight_bytes"] / 2**20,
                            "kv_blocks": st["kv_blocks_total"]}
            except Exception as exc:
                res[key] = {"error": f"{type(exc).__name__}: {exc}",
                            "traceback": traceback.format_exc()[-1500:]}
        return res

    big = make_model("smollm2-1.7b", args.tokenizer, args.models, dev, args.tiny)

    @section("forward_profile_1.7b", out)
    def _profile():
        from specserve.spec_decode.profiler import profile_forward

        llm = LLM(str(big), device=dev, kv_cache_memory=4 << 30, enable_prefix_caching=False)
        res = {"load_s": llm.engine.load_time}
        for ctx in (96, 1024):
            cm = profile_forward(llm.engine.runner, context=ctx, repeats=5)
            res[f"ms_by_tokens_ctx{ctx}"] = {int(x): round(y * 1e3, 3)
                                            for x, y in zip(cm.x, cm.y, strict=True)}
        free(llm)
        return res

    @section("throughput_1.7b", out)
    def _throughput():
        from specserve.bench.lab import prepare_workload, run_workload, warm_up

        strategies = {
            "off": {},
            "ngram-static": {"speculative_config": {"method": "ngram",
                                                    "num_speculative_tokens": 4},
                             "speculation_policy": "static"},
            "draft-static": {"speculative_config": {"method": "draft", "model": str(small),
                                                    "num_speculative_tokens": 4},
                             "speculation_policy": "static"},
            "adaptive-draft": {"speculative_config": {"method": "draft", "model": str(small),
                                                      "num_speculative_tokens": 4},
                               "speculation_policy": "adaptive"},
        }
        concurrency = (1, 32) if args.tiny else (1, 32, 64)
        if args.concurrency:
            concurrency = tuple(int(c) for c in args.concurrency.split(","))
        res = {}
        for run, name in enumerate(args.order.split(",")):
            kw = strategies[name]
            llm = LLM(str(big), device=dev, kv_cache_memory=4 << 30,
                      enable_prefix_caching=False, max_num_seqs=128, **kw)
            warm_up(llm.engine)
            wl = prepare_workload(llm.engine, "prose", cap=64 if not args.tiny else 8)
            key = f"{run}:{name}"
            res[key] = {"profile_s": llm.engine.profile_time}
            for c in concurrency:
                r = run_workload(llm.engine, wl, c, max(2 * c, 8), ignore_eos=True)
                res[key][f"c{c}"] = {k: r[k] for k in (
                    "output_tok_s", "tpot_p50_ms", "ttft_p50_ms", "acceptance_rate",
                    "spec_k_mean", "num_steps", "forward_time_s", "step_time_s",
                    "draft_time_s")}
            free(llm)
        return res

    @section("transformers_generate_1.7b", out)
    def _hf_speed():
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(big))
        hf = AutoModelForCausalLM.from_pretrained(str(big), dtype=torch.bfloat16).to(dev).eval()
        res = {}
        n_new = 8 if args.tiny else 64
        for batch in (1, 32):
            ids = torch.tensor([tok(PROMPTS[0], add_special_tokens=False).input_ids] * batch,
                               device=dev)
            mask = torch.ones_like(ids)
            hf.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)  # warm-up
            _sync(dev)
            t0 = time.perf_counter()
            hf.generate(ids, attention_mask=mask, max_new_tokens=n_new, min_new_tokens=n_new,
                        do_sample=False)
            _sync(dev)
            res[f"batch{batch}_tok_s"] = batch * n_new / (time.perf_counter() - t0)
        free(hf)
        return res


def _copy(lin):
    from torch import nn

    new = nn.Linear(lin.in_features, lin.out_features, bias=False, dtype=lin.weight.dtype,
                    device=lin.weight.device)
    with torch.no_grad():
        new.weight.copy_(lin.weight)
    return new


def _sync(dev: str) -> None:
    if dev.startswith("cuda"):
        torch.cuda.synchronize()


def _time_us(module, x: torch.Tensor, dev: str, iters: int = 50) -> float:
    with torch.no_grad():
        for _ in range(5):
            module(x)
        _sync(dev)
        t0 = time.perf_counter()
        for _ in range(iters):
            module(x)
        _sync(dev)
    return (time.perf_counter() - t0) / iters * 1e6


if __name__ == "__main__":
    main()
