"""What serving a LoRA adapter costs here: the embedded model (bf16), a random rank-16 PEFT
adapter on all seven projections, output tok/s of the same prompts run on the base model, all
through the adapter, and half and half, at concurrency 1 and 32, rounds interleaved on one
engine (and the base model through the Python layers, the path a step with adapter rows
takes). Usage: HF_HUB_OFFLINE=1 .venv/bin/python docs/results/2026-12-07-session48/lora_cost.py"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from specserve import LLM, LoRARequest, SamplingParams
from specserve.bench.offline import load_hf_gguf_model

ROUNDS, OUT = 3, 64


def make_adapter(path: Path, rank: int = 16) -> None:
    import peft

    model = load_hf_gguf_model(torch.float32)
    torch.manual_seed(0)
    config = peft.LoraConfig(r=rank, lora_alpha=rank, init_lora_weights="gaussian",
                             target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                             "gate_proj", "up_proj", "down_proj"])
    peft.get_peft_model(model, config).save_pretrained(path)


def main() -> None:
    path = Path(tempfile.mkdtemp()) / "lora"
    make_adapter(path)
    llm = LLM(enable_lora=True)
    lora = LoRARequest("random", 1, str(path))
    params = SamplingParams(temperature=0, max_tokens=OUT, ignore_eos=True)
    prompts = [f"Write a short story about a {w} who learns to {v}."
               for w in ("cat", "robot", "sailor", "baker", "child", "dragon", "teacher", "bird")
               for v in ("sing", "swim", "fly", "cook")]
    llm.generate(prompts[:4], params, lora_request=lora)  # warm-up, both paths
    llm.generate(prompts[:4], params)
    # "base-python": the base model through LlamaModel.forward instead of the C++ layer loop,
    # which a step with adapter rows takes: what of the adapter's cost is the path, not the
    # updates.
    modes = {"base": lambda n: None, "base-python": lambda n: None,
             "adapter": lambda n: [lora] * n,
             "half": lambda n: [lora if i % 2 else None for i in range(n)]}
    layer_loop = llm.engine.runner.layer_loop
    for conc in (1, 32):
        tput: dict[str, list[float]] = {m: [] for m in modes}
        for r in range(ROUNDS):
            order = list(modes)[r % len(modes):] + list(modes)[:r % len(modes)]
            for mode in order:
                batch = prompts[:conc] if conc > 1 else prompts[:4]
                loras = modes[mode](len(batch))
                llm.engine.runner.layer_loop = None if mode == "base-python" else layer_loop
                t0 = time.perf_counter()
                if conc == 1:  # one request at a time
                    for j, p in enumerate(batch):
                        llm.generate([p], params,
                                     lora_request=None if loras is None else loras[j])
                else:
                    llm.generate(batch, params, lora_request=loras)
                tput[mode].append(len(batch) * OUT / (time.perf_counter() - t0))
        for mode, runs in tput.items():
            ratios = [x / b for x, b in zip(runs, tput["base"], strict=True)]
            print(f"c{conc:<3} {mode:8s} tok/s median {statistics.median(runs):7.1f} "
                  f"runs {', '.join(f'{x:.1f}' for x in runs)}  / base per round "
                  f"{', '.join(f'{x:.3f}' for x in ratios)}", flush=True)
    print(f"torch threads {torch.get_num_threads()}, {sys.version.split()[0]}")


if __name__ == "__main__":
    main()
