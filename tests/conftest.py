"""Shared fixtures. The real embedded model is loaded once per session (fp32, so that greedy
output can be compared token for token with Hugging Face transformers)."""

from __future__ import annotations

import copy
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# SPECSERVE_TEST_THREADS=1 keeps a test run from starving a benchmark (or another run) beside it.
# Under pytest-xdist (`make test`) the cores are shared among the workers.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1))
torch.set_num_threads(int(os.environ.get("SPECSERVE_TEST_THREADS",
                                         max(1, min(2, (os.cpu_count() or 1) // _WORKERS)))))

# Varied prompts: prose, code, lists, chat-formatted, non-English, numbers.
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Write a haiku about the sea.",
    "1, 2, 3, 4,",
    "<|im_start|>user\nWhat is the boiling point of water?<|im_end|>\n<|im_start|>assistant\n",
    "La recette de la tarte aux pommes commence par",
    '{"name": "Alice", "age": 30, "city":',
    "SELECT name FROM users WHERE",
]


def _runner_shape(runner) -> tuple:
    """What a forward profile depends on: the model's layers and weight formats, the dtype and
    device, the KV pool's size, block size and format, the kernel paths, the residual streams
    the forward also returns (an EAGLE head's features) and the threads."""
    modules = tuple((type(m).__name__, str(getattr(getattr(m, "weight", None), "dtype", None)))
                    for m in runner.model.modules())
    cache = runner.kv_caches[0]
    return (type(runner.model).__name__, repr(runner.cfg), modules, runner.dtype,
            str(runner.device), runner.num_blocks, runner.block_size, cache.k.dtype,
            cache.kernel_format, runner.use_kernel, runner.layer_loop is not None,
            runner.aux_layers, torch.get_num_threads())


@pytest.fixture(scope="session", autouse=True)
def _one_profile_per_engine_shape():
    """An engine that may speculate profiles its forwards at start-up (profiler.profile_forward:
    4-7 s here), and the suite builds many engines of the same shape: 17 profiles, 114 s, in the
    speculation tests alone. Each shape is profiled once per run; later engines get a copy (the
    online scale is per engine). Tests of the profiler itself call it directly and still run it."""
    from specserve.engine import llm_engine

    measured: dict = {}
    profile = llm_engine.profile_forward

    def shared(runner, *args, **kwargs):
        key = (_runner_shape(runner), args, tuple(sorted(kwargs.items())))
        if key not in measured:
            measured[key] = profile(runner, *args, **kwargs)
        return copy.deepcopy(measured[key])

    patch = pytest.MonkeyPatch()
    patch.setattr(llm_engine, "profile_forward", shared)
    yield
    patch.undo()


@pytest.fixture(scope="session")
def llm():
    from specserve import LLM

    return LLM(dtype="float32")


@pytest.fixture(scope="session")
def hf_model():
    pytest.importorskip("accelerate")
    from specserve.bench.offline import load_hf_gguf_model

    return load_hf_gguf_model(torch.float32).eval()


def hf_greedy(model, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """transformers' greedy replies to all prompts in one left-padded batch: 4.4x faster than one
    at a time here (6 s against 27 s for the 8 PROMPTS, 64 tokens each) and, checked on this
    suite's prompts, the same tokens."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens,
                             min_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None,
                             pad_token_id=0)
    return out[:, width:].tolist()


class FakeClock:
    """Stands in for `time` in specserve/train/loop.py: every reading advances `tick` seconds,
    so a budgeted run stops at the same step on any machine, however loaded."""

    def __init__(self, tick: float):
        self.now, self.tick = 0.0, tick

    def perf_counter(self) -> float:
        self.now += self.tick
        return self.now


@pytest.fixture
def fake_clock(monkeypatch) -> FakeClock:
    from specserve.train import loop

    clock = FakeClock(tick=0.01)
    monkeypatch.setattr(loop, "time", clock)
    return clock
