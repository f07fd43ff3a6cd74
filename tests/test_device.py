"""The `device` option: validation, and the host-to-device hand-off of a step's tensors.

The CUDA path itself was checked on a lent H200 (docs/results/2026-11-30-session4/gpu_check.py);
here the hand-off is checked against the meta device, which every torch build has: a tensor a
step forgets to move stays on the CPU and fails the test."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from specserve import LLM, SamplingParams
from specserve.config import EngineConfig
from specserve.engine.request import Request
from tests.tiny_models import make_tiny_model


def test_bad_devices_are_refused():
    with pytest.raises(ValueError, match="cpu or cuda"):
        EngineConfig(device="mps")
    with pytest.raises(RuntimeError):
        EngineConfig(device="not-a-device")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            EngineConfig(device="cuda")


def _request(llm: LLM, n: int, computed: int) -> Request:
    req = Request(f"r{n}", list(range(2, 2 + n)), SamplingParams(max_tokens=4), (1,), None, 256)
    llm.engine.block_manager.allocate(req, n)
    req.num_computed_tokens = computed
    return req


def _tensors(obj) -> list[tuple[str, torch.Tensor]]:
    return [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)
            if isinstance(getattr(obj, f.name), torch.Tensor)]


def test_every_step_tensor_moves_to_the_device(tmp_path):
    llm = LLM(str(make_tiny_model(tmp_path / "m")), dtype="float32", num_blocks=64)
    runner = llm.engine.runner
    runner.use_kernel = False  # the gather path is the one a GPU takes
    # A decode (a short query) and two prefill chunks of different lengths (long queries,
    # padded to the longer one) in one step.
    scheduled = [(_request(llm, 40, 39), 1), (_request(llm, 30, 0), 30),
                 (_request(llm, 25, 0), 25)]
    inputs = runner.prepare(scheduled)
    assert len(inputs.meta.groups) == 2
    runner.device = torch.device("meta")
    moved = runner._to_device(inputs)
    found = _tensors(moved) + _tensors(moved.meta)
    for g in moved.meta.groups:
        found += _tensors(g)
    assert {name for name, _ in found} >= {"input_ids", "positions", "slot_mapping",
                                            "kv_gather", "attn_bias", "query_gather"}
    assert all(t.is_meta for _, t in found), [n for n, t in found if not t.is_meta]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_greedy_equals_cpu(tmp_path):
    """Greedy output on the GPU, with n-gram drafts verified there (static: every step drafts
    where the repeating prompts give a match), equals the CPU engine's without drafts, and
    transformers' on the GPU."""
    from transformers import AutoModelForCausalLM

    path = str(make_tiny_model(tmp_path / "m"))
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = [[2, 3, 4, 5] * 4, [9, 8, 7] * 5]
    want = [o.outputs[0].token_ids for o in LLM(path, dtype="float32").generate(prompts, params)]
    cuda = LLM(path, dtype="float32", device="cuda", speculation_policy="static",
               speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    assert [o.outputs[0].token_ids for o in cuda.generate(prompts, params)] == want
    assert cuda.get_stats()["num_draft_tokens"] > 0
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()
    for prompt, tokens in zip(prompts, want, strict=True):
        with torch.inference_mode():
            ref = hf.generate(torch.tensor([prompt]).cuda(), max_new_tokens=16,
                              min_new_tokens=16, do_sample=False, eos_token_id=None,
                              pad_token_id=0)
        assert ref[0, len(prompt):].tolist() == tokens
