"""torch.compile of the model forward at a batch-1 decode step (session 5), on the pure-PyTorch
path (SPECSERVE_NO_EXT=1: dynamo cannot trace the pybind kernels), against the same forward eager.

Usage: python docs/results/2026-11-30-session5/compile_try.py [gguf|int4|...]
Measured here: eager 8.1-8.7 ms, compiled 6.5-6.9 ms; 41 s of compilation cold, 4.4 s when
inductor's on-disk cache already holds the graph. Under inference_mode
inductor refused the inference tensors ("Cannot set version_counter for inference tensor"), so
the compiled function runs the undecorated forward under no_grad.
"""

from __future__ import annotations

import functools
import os
import sys
import time

os.environ["SPECSERVE_NO_EXT"] = "1"

import torch  # noqa: E402

from specserve.bench.offline import make_prompts  # noqa: E402
from specserve.llm import LLM  # noqa: E402
from specserve.sampling_params import SamplingParams  # noqa: E402


def main(quantization: str) -> None:
    llm = LLM(quantization=quantization)
    eng = llm.engine
    prompt = make_prompts(llm.get_tokenizer(), 1, 128)[0]
    eng.add_request(prompt, SamplingParams(temperature=0, max_tokens=10_000, ignore_eos=True))
    for _ in range(5):
        eng.step()
    runner = eng.runner
    inputs = runner.prepare([(eng.scheduler.running[0], 1)])
    args = (inputs.input_ids, inputs.positions, runner.kv_caches, inputs.meta)

    def bench(fn, n: int = 50) -> float:
        for _ in range(5):
            fn(*args)
        t0 = time.perf_counter()
        for _ in range(n):
            fn(*args)
        return (time.perf_counter() - t0) / n * 1e3

    print(f"eager (no extension) forward: {bench(runner.model.forward):.2f} ms", flush=True)
    forward = type(runner.model).forward.__wrapped__  # without @torch.inference_mode
    compiled_fn = torch.compile(functools.partial(forward, runner.model), dynamic=False)

    def compiled(*a):
        with torch.no_grad():
            return compiled_fn(*a)

    t0 = time.perf_counter()
    out = compiled(*args)
    print(f"compile: {time.perf_counter() - t0:.1f} s", flush=True)
    ref = runner.model.forward(*args)
    print("max |compiled - eager|:", (out.float() - ref.float()).abs().max().item())
    print(f"compiled forward: {bench(compiled):.2f} ms")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "gguf")
