"""`specserve bench quant`: every weight and KV-cache precision side by side, with llama.cpp.

For each mode (bf16, fp32, int8, int4, gguf, fp8 weights; int8 and fp8 KV caches), in a fresh
process:
model memory, KV blocks and the most 1k-token sequences a fixed KV budget holds, perplexity on
the standard library's documentation text (bench/quality.py), and output tok/s at concurrency 1
(requests one after another) and at concurrency 32 (one wave). llama.cpp (llama-cpp-python, when
installed) runs the same token prompts at concurrency 1, greedy with EOS banned, in its own
process, on the engines' thread count (for its prefill too). Every figure comes from this run;
nothing is carried over.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from specserve.bench.baselines import llama_cpp_available
from specserve.bench.isolate import Progress, run_isolated
from specserve.bench.report import fmt  # "—" for a figure not measured

# The KV modes and the weight-only modes run in the engine's "auto" dtype (bf16 where the CPU has
# bf16 GEMMs, else fp32; the integer modes always bf16): each row records what it ran in.
MODES: dict[str, dict] = {
    "bf16": {"dtype": "bfloat16"},
    "fp32": {"dtype": "float32"},
    "int8": {"quantization": "int8"},
    "int4": {"quantization": "int4"},
    "gguf": {"quantization": "gguf"},
    "fp8": {"quantization": "fp8"},
    "kv-int8": {"kv_cache_dtype": "int8"},
    "kv-fp8": {"kv_cache_dtype": "fp8_e4m3"},
}
SEQ_LEN = 1024  # "maximum concurrent 1k-token sequences"


@dataclass
class QuantSettings:
    input_len: int = 128
    output_len: int = 64
    num_sequential: int = 4  # requests measured one after another at concurrency 1
    batch: int = 32
    kv_cache_memory: int = 1 << 30
    ppl_tokens: int = 4096
    num_threads: int | None = None


def _measure_mode(name: str, settings: QuantSettings, progress: Progress) -> dict:
    import torch

    from specserve.bench.offline import bench_engine, make_prompts
    from specserve.bench.quality import perplexity, reference_text
    from specserve.llm import LLM

    progress(f"{name}: loading", 0)
    t0 = time.perf_counter()
    # Prefix caching off: the warm-up's prompt is the c=1 series' first, and the batch reuses
    # the c=1 prompts, whose prefills the cache would skip; llama.cpp pays every prefill
    # (llama.reset()). Off rather than reset between series, so no series can ever hit it.
    llm = LLM(kv_cache_memory=settings.kv_cache_memory, num_threads=settings.num_threads,
              enable_prefix_caching=False, **MODES[name])
    load_s = time.perf_counter() - t0
    engine = llm.engine
    blocks, block_size = engine.block_manager.num_blocks, engine.config.cache.block_size
    progress(f"{name}: perplexity", 0)
    ppl = perplexity(engine, engine.tokenize(reference_text())[:settings.ppl_tokens])
    prompts = make_prompts(llm.get_tokenizer(), max(settings.batch, settings.num_sequential),
                           settings.input_len)
    bench_engine(llm, prompts[:1], 8)  # warm-up
    progress(f"{name}: concurrency 1", 0)
    tokens, wall, tpots = 0.0, 0.0, []
    for p in prompts[:settings.num_sequential]:
        r = bench_engine(llm, [p], settings.output_len)
        tokens, wall = tokens + r.output_tok_s * r.wall_s, wall + r.wall_s
        tpots.append(r.tpot_p50_ms if settings.output_len > 1 else None)  # 1 token: no TPOT
    progress(f"{name}: concurrency {settings.batch}", 0)
    batch = bench_engine(llm, prompts[:settings.batch], settings.output_len)
    progress(f"{name}: done", 1)
    return {"mode": name, "engine_kwargs": MODES[name], "dtype": str(engine.dtype).split(".")[-1],
            "load_s": load_s,
            "weight_bytes": engine.weight_bytes, "kv_cache_bytes": engine.runner.kv_cache_bytes,
            "kv_blocks": blocks, "max_1k_seqs": blocks * block_size // SEQ_LEN,
            "perplexity": ppl, "tok_s_c1": tokens / wall, "tok_s_batch": batch.output_tok_s,
            "decode_tok_s_c1": per_second(tpots), "num_threads": torch.get_num_threads(),
            "prompts_c1": prompts[:settings.num_sequential]}


def _measure_llama_cpp(prompts: list[list[int]], settings: QuantSettings,
                       progress: Progress) -> dict:
    from specserve.bench.baselines import engine_threads, load_llama_cpp, token_chunk_times

    progress("llama.cpp: loading", 0)
    llama = load_llama_cpp(None, settings.num_threads, seed=0)
    ban_eos = {llama.token_eos(): -1e9}  # llama.cpp has no ignore_eos

    def run(prompt: list[int], max_tokens: int) -> tuple[int, float | None]:
        """Streams one request: (tokens, ms per output token after the first, None for one)."""
        llama.reset()  # cold prefill, as ours
        # Only the chunks that carry a token: the stream's final chunk carries none.
        stamps = token_chunk_times(llama.create_completion(
            prompt=prompt, max_tokens=max_tokens, temperature=0.0, logit_bias=ban_eos,
            stream=True))
        n = len(stamps)
        return n, (stamps[-1] - stamps[0]) * 1e3 / (n - 1) if n > 1 else None

    run(prompts[0], 8)  # warm-up
    progress("llama.cpp: concurrency 1", 0)
    tokens, tpots, t0 = 0, [], time.perf_counter()
    for p in prompts[:settings.num_sequential]:
        n, tpot = run(p, settings.output_len)
        tokens, tpots = tokens + n, tpots + [tpot]
    progress("llama.cpp: done", 1)
    return {"mode": "llama.cpp (gguf Q4_1)", "tok_s_c1": tokens / (time.perf_counter() - t0),
            "decode_tok_s_c1": per_second(tpots),
            "num_threads": engine_threads(settings.num_threads)}  # the engine rows' too


def per_second(tpots_ms: list[float | None]) -> float | None:
    """Decode tok/s from the requests' times per output token (ms): None where none had a
    second token (--output-len 1, a one-chunk llama.cpp reply) or the median is 0, instead of
    a ZeroDivisionError."""
    xs = [t for t in tpots_ms if t is not None]
    mid = statistics.median(xs) if xs else 0.0
    return 1e3 / mid if mid > 0 else None


SPEEDS = ("tok_s_c1", "decode_tok_s_c1", "tok_s_batch")


def _median_of(reps: list[dict]) -> dict:
    """One row from repetitions of a mode: the median of each speed (None where no repetition
    has it), the rest from the first (deterministic), and every repetition's speeds kept. Of an
    even count, the lower middle (median_low), the rule of every bench median over repetitions:
    a figure that some repetition measured."""
    row = dict(reps[0])
    for key in SPEEDS:
        if key in row:
            xs = [r[key] for r in reps if r[key] is not None]
            row[key] = statistics.median_low(xs) if xs else None
    row["repetitions"] = [{k: r[k] for k in SPEEDS if k in r} for r in reps]
    return row


def run_quant_bench(modes: list[str], settings: QuantSettings, progress: Progress,
                    with_llama_cpp: bool = True, repeats: int = 1) -> dict:
    """Each repetition runs every mode (and llama.cpp) in a fresh process, in an order rotated
    by one per repetition, so that machine drift does not always favour the same mode."""
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown modes {unknown}; choose from {list(MODES)}")
    names = modes + (["llama.cpp"] if with_llama_cpp and llama_cpp_available() else [])
    runs: dict[str, list[dict]] = {n: [] for n in names}
    prompts = None
    for rep in range(repeats):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            if name != "llama.cpp":
                row = run_isolated(_measure_mode, (name, settings), progress)
                prompts = row["prompts_c1"]
            else:  # the very token ids our c=1 runs use (the same in every mode)
                if prompts is None:
                    prompts = run_isolated(_measure_mode, (modes[0], settings),
                                           progress)["prompts_c1"]
                row = run_isolated(_measure_llama_cpp, (prompts, settings), progress)
            runs[name].append(row)
    return {"settings": vars(settings), "repeats": repeats,
            "rows": [_median_of(runs[m]) for m in modes],
            "llama_cpp": _median_of(runs["llama.cpp"]) if "llama.cpp" in runs else None}


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "—"


def format_quant(result: dict) -> str:
    s = result["settings"]
    rows = result["rows"]
    ref = next((r for r in rows if r["mode"] == "bf16"), rows[0])
    lcpp = result["llama_cpp"]
    lines = [f"{'mode':<22} {'dtype':>8} {'weights MiB':>11} {'KV blocks':>9} {'1k seqs':>7} "
             f"{'ppl':>8} {'Δppl %':>7} {'tok/s @1':>8} {'decode @1':>9} "
             f"{'tok/s @' + str(s['batch']):>9} {'@1 vs llama.cpp':>15}"]
    for r in rows:
        vs = (f"{_ratio(r['tok_s_c1'], lcpp['tok_s_c1'])} / "
              f"{_ratio(r['decode_tok_s_c1'], lcpp['decode_tok_s_c1'])}" if lcpp else "-")
        lines.append(
            f"{r['mode']:<22} {r.get('dtype', ''):>8} {r['weight_bytes'] / 2**20:>11.1f} "
            f"{r['kv_blocks']:>9} "
            f"{r['max_1k_seqs']:>7} {r['perplexity']:>8.3f} "
            f"{100 * (r['perplexity'] / ref['perplexity'] - 1):>+7.2f} {r['tok_s_c1']:>8.1f} "
            f"{fmt(r['decode_tok_s_c1']):>9} {r['tok_s_batch']:>9.1f} {vs:>15}")
    if lcpp:
        lines.append(f"{lcpp['mode']:<22} {'':>8} {'':>11} {'':>9} {'':>7} {'':>8} {'':>7} "
                     f"{lcpp['tok_s_c1']:>8.1f} {fmt(lcpp['decode_tok_s_c1']):>9} "
                     f"{'':>9} {'1.00x / 1.00x':>15}")
    else:
        lines.append("llama.cpp: not measured (pip install -e '.[peers]' adds llama-cpp-python)")
    lines.append(f"median of {result.get('repeats', 1)} repetition(s); "
                 f"{s['input_len']}-token prompts, {s['output_len']} output tokens; @1: "
                 f"{s['num_sequential']} requests one after another (tok/s: output tokens over "
                 "wall time, prefill included; decode: 1 / median time per output token); "
                 "KV budget "
                 f"{s['kv_cache_memory'] / 2**30:g} GiB; perplexity over {s['ppl_tokens']} "
                 "tokens of pydoc_data")
    return "\n".join(lines)
