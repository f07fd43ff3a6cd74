"""Other engines on the lab's prompts (`--compare-hf`): Hugging Face `generate` with static
batching, its prompt-lookup assisted generation at concurrency 1, and llama.cpp at concurrency 1
when `llama-cpp-python` is installed. Each returns run dicts shaped like the lab's own. HF runs
on the engines' device; llama.cpp runs on the CPU only, so it is skipped beside GPU engines.
Each is warmed up first, as the engines are: llama.cpp with one untimed request, HF with one
at batch 1 and a wave at the lab's highest concurrency (lab.warm_up_batches). They compute with
the engines' thread count (engine_threads).

Static batching has no closed loop: the prompts run in waves of `concurrency`, each wave
left-padded and decoding until its longest request is done. A wave's TTFT is measured by a
separate one-token `generate` on the same batch; every request's TPOT is the wave's decode time
over its decode steps.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Sequence
from dataclasses import asdict

import torch

from specserve.bench.lab import (
    LabRun,
    PreparedWorkload,
    Preset,
    Progress,
    RequestRecord,
    latency_figures,
    shortest_workload,
)
from specserve.bench.workloads import CONSTRAINED_WORKLOADS


def hf_available() -> bool:
    return (importlib.util.find_spec("transformers") is not None
            and importlib.util.find_spec("accelerate") is not None)


def llama_cpp_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def load_hf(model: str | None, dtype: torch.dtype, device: str | torch.device = "cpu"):
    """The lab's model in transformers, on the engine's device: the same reading as `bench
    offline --compare-hf` (offline.load_hf_model says why a .gguf goes through our loader)."""
    from specserve.bench.offline import load_hf_model

    return load_hf_model(dtype, model, device)


def warm_up_hf(model, prompt: list[int], pad_id: int, concurrency: int = 1) -> None:
    """Untimed short generates, at batch 1 and at `concurrency`. The first of a shape pays
    one-time costs (lazy init, kernels for new shapes): run_hf's first TTFT probe would carry
    them, and through TPOT = (t - ttft) / steps they would also shrink that wave's TPOT. The
    engines are warmed up the same way (lab.warm_up, lab.warm_up_batches)."""
    _generate(model, [prompt], 2, pad_id, None)
    if concurrency > 1:
        _generate(model, [prompt] * concurrency, 8, pad_id, None)


def _useful_tokens(row: list[int], eos: set[int], limit: int, ignore_eos: bool) -> int:
    """Tokens the request asked for: up to its own max_tokens and its first EOS (included, as
    the engine counts it)."""
    if not ignore_eos:
        for i, t in enumerate(row[:limit]):
            if t in eos:
                return i + 1
    return min(len(row), limit)


def _generate(model, batch: Sequence[list[int]], max_new: int, pad_id: int,
              eos: list[int] | None, **extra) -> tuple[list[list[int]], float]:
    width = max(len(p) for p in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(batch):  # left padding: every row's last prompt token lines up
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    ids, mask = ids.to(model.device), mask.to(model.device)  # the engine's device, as the model
    kw = dict(do_sample=False, pad_token_id=pad_id, eos_token_id=eos, max_new_tokens=max_new)
    if eos is None:
        kw["min_new_tokens"] = max_new
    with torch.inference_mode():
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=mask, **kw, **extra)
        wall = time.perf_counter() - t0
    return out[:, width:].tolist(), wall


def run_hf(model, workload: PreparedWorkload, concurrency: int, num_prompts: int,
           eos_ids: Sequence[int], ignore_eos: bool = False, prompt_lookup: int = 0) -> dict:
    """Static-batch `generate` in waves of `concurrency` (prompt_lookup > 0: assisted generation
    by prompt lookup, which transformers supports at batch size 1 only)."""
    requests = workload.take(num_prompts)
    eos = None if ignore_eos else list(eos_ids)
    pad = eos_ids[0] if eos_ids else 0
    extra = {"prompt_lookup_num_tokens": prompt_lookup} if prompt_lookup else {}
    records, wall = [], 0.0
    for start in range(0, len(requests), concurrency):
        wave = requests[start:start + concurrency]
        prompts = [p for p, _ in wave]
        max_new = max(m for _, m in wave)
        _, ttft = _generate(model, prompts, 1, pad, eos)
        rows, t = _generate(model, prompts, max_new, pad, eos, **extra)
        steps = max(max(len(r) for r in rows) - 1, 1)
        tpot = max(t - ttft, 0.0) / steps
        for (p, m), row in zip(wave, rows, strict=True):
            n = _useful_tokens(row, set(eos_ids), m, ignore_eos)
            records.append(RequestRecord(len(p), n, ttft, tpot if n > 1 else None,
                                         wall, wall + t))
        wall += t
    weights = sum(p.nbytes for p in model.parameters())
    return {"concurrency": concurrency, "num_prompts": num_prompts,
            **latency_figures(records, wall), "target_weight_bytes": weights,
            "requests": [asdict(r) for r in records]}


def engine_threads(num_threads: int | None) -> int:
    """The threads the engines under test compute with: --num-threads, else torch's default,
    which an LLMEngine keeps (it is the same in this process and in the lab's spawned ones).
    A baseline on more threads than the engine would win by the thread count."""
    return num_threads or torch.get_num_threads()


def load_llama_cpp(model: str | None, num_threads: int | None, seed: int):
    from llama_cpp import Llama

    from specserve.models.loader import embedded_model_path

    path = model or embedded_model_path()
    if not path.endswith(".gguf"):
        raise ValueError("llama.cpp needs a .gguf model")
    # n_threads_batch (prefill) too: llama-cpp-python defaults it to every CPU.
    threads = engine_threads(num_threads)
    return Llama(model_path=path, n_ctx=4096, n_threads=threads, n_threads_batch=threads,
                 seed=seed, verbose=False)


def warm_up_llama_cpp(llama, prompt: list[int]) -> None:
    """One untimed short completion: the first pays the first decode and the page faults of
    the mmapped GGUF (bench quant warms up the same way)."""
    llama.reset()
    llama.create_completion(prompt=prompt, max_tokens=8, temperature=0.0)


def token_chunk_times(stream) -> list[float]:
    """The perf_counter time of each chunk of a llama-cpp-python completion stream that
    carries a token. Every stream ends with one more chunk, of no text and with its
    finish_reason set: it carries no token, and counting it would add a token and a ~0 s
    interval to every request."""
    times = []
    for chunk in stream:
        now = time.perf_counter()
        choice = chunk["choices"][0]
        if choice["text"] or choice.get("finish_reason") is None:
            times.append(now)
    return times


def run_llama_cpp(llama, workload: PreparedWorkload, num_prompts: int,
                  ignore_eos: bool = False) -> dict:
    """One request at a time through llama-cpp-python's streaming completion (greedy). The
    token count is that of the chunks carrying a token (token_chunk_times): never high, but a
    little low where a chunk holds back an incomplete UTF-8 character and then carries two,
    and by one where a request stops on EOS, which llama.cpp does not stream (the engine and
    HF count it)."""
    records, wall = [], 0.0
    for prompt, max_tokens in workload.take(num_prompts):
        llama.reset()  # no reuse of the previous request's KV cache: cold prefills, like ours
        t0 = time.perf_counter()
        # llama.cpp has no ignore_eos: forbidding the EOS token does the same.
        kw = {"logit_bias": {llama.token_eos(): -1e9}} if ignore_eos else {}
        times = token_chunk_times(llama.create_completion(
            prompt=prompt, max_tokens=max_tokens, temperature=0.0, stream=True, **kw))
        end = time.perf_counter()
        n = len(times)
        ttft = (times[0] if times else end) - t0
        tpot = (times[-1] - times[0]) / (n - 1) if n > 1 else None
        records.append(RequestRecord(len(prompt), n, ttft, tpot, wall, wall + end - t0))
        wall += end - t0
    return {"concurrency": 1, "num_prompts": num_prompts, **latency_figures(records, wall),
            "requests": [asdict(r) for r in records]}


def run_baselines(lab: LabRun, preset: Preset, model: str | None, dtype: torch.dtype,
                  num_threads: int | None, seed: int, progress: Progress,
                  device: str = "cpu") -> None:
    """Append the other engines' rows and points to the lab (after its own strategies, which
    rendered the prompts). A missing optional package becomes a 'skipped' row. device: the
    engines' (--device); HF runs there too, llama.cpp (CPU only here) is skipped elsewhere."""
    # Their generate() takes no grammar: a constrained workload would run unconstrained.
    workloads = [wl for wl in lab.workloads.values() if not wl.structured_outputs]
    if not workloads:
        return
    threads = engine_threads(num_threads)
    if hf_available():
        progress("hf-generate: loading", 0)
        # HF runs here, in the parent, where nothing set --num-threads: the engines' count.
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            _run_hf_rows(lab, preset, model, dtype, device, workloads, threads, progress)
        finally:
            torch.set_num_threads(previous)
    else:
        lab.strategies.append({"name": "hf-generate", "status": "skipped",
                               "error": "needs transformers and accelerate"})
    if llama_cpp_available():
        progress("llama.cpp: loading", 0)
        try:
            if torch.device(device).type != "cpu":
                # load_llama_cpp offloads no layers: a CPU row beside the engine's GPU rows.
                raise ValueError(f"llama.cpp runs on the CPU here (no GPU offload), the engines "
                                 f"on {device}: not comparable")
            llama = load_llama_cpp(model, num_threads, seed)
        except ValueError as exc:
            lab.strategies.append({"name": "llama.cpp", "status": "skipped", "error": str(exc)})
            progress("llama.cpp: skipped", len(workloads))
            return
        warm_up_llama_cpp(llama, workloads[0].prompts[0])
        lab.strategies.append({"name": "llama.cpp", "status": "ok", "num_threads": threads})
        for wl in workloads:
            progress(f"llama.cpp · {wl.name} · c=1", 0)
            _add(lab, progress, "llama.cpp", wl.name, 1, [
                run_llama_cpp(llama, wl, preset.num_prompts(1), preset.ignore_eos)
                for _ in range(preset.repeats)])


def _run_hf_rows(lab: LabRun, preset: Preset, model: str | None, dtype: torch.dtype,
                 device: str, workloads: list[PreparedWorkload], threads: int,
                 progress: Progress) -> None:
    eos = lab.eos_token_ids
    hf = load_hf(model, dtype, device)
    warm_up_hf(hf, shortest_workload(workloads).prompts[0], eos[0] if eos else 0,
               max(preset.concurrency))
    weights = sum(p.nbytes for p in hf.parameters())
    for name in ("hf-generate", "hf-prompt-lookup"):
        lab.strategies.append({"name": name, "status": "ok", "target_weight_bytes": weights,
                               "num_threads": threads})
    for wl in workloads:
        for c in preset.concurrency:
            progress(f"hf-generate · {wl.name} · c={c}", 0)
            _add(lab, progress, "hf-generate", wl.name, c, [
                run_hf(hf, wl, c, preset.num_prompts(c), eos, preset.ignore_eos)
                for _ in range(preset.repeats)])
        progress(f"hf-prompt-lookup · {wl.name} · c=1", 0)
        _add(lab, progress, "hf-prompt-lookup", wl.name, 1, [
            run_hf(hf, wl, 1, preset.num_prompts(1), eos, preset.ignore_eos, prompt_lookup=4)
            for _ in range(preset.repeats)])


def _add(lab: LabRun, progress: Progress, strategy: str, workload: str, concurrency: int,
         runs: list[dict]) -> None:
    lab.points.append({"strategy": strategy, "workload": workload, "concurrency": concurrency,
                       "runs": runs})
    progress(f"{strategy} · {workload} · c={concurrency}", 1)


def num_baseline_points(preset: Preset) -> int:
    """How many points run_baselines adds (for the progress bar)."""
    n = sum(1 for w in preset.workloads if w not in CONSTRAINED_WORKLOADS)
    return (n * (len(preset.concurrency) + 1) if hf_available() else 0) \
        + (n if llama_cpp_available() else 0)
