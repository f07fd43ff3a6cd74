"""One forward of q sequences x 1 token (the profile's shape) against 1 sequence x q tokens (a verification), fastest of 5, twice.
Usage: python verify_shape.py"""
import torch, time
from specserve import LLM
from specserve.spec_decode.profiler import _fake_seq, _fastest
llm = LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 4}, speculation_policy="off")
r = llm.engine.model_runner if hasattr(llm.engine, "model_runner") else None
if r is None:
    for k, v in vars(llm.engine).items():
        if type(v).__name__ == "ModelRunner": r = v
print(type(r))
for rep in range(2):
    for q in (1, 2, 3, 5):
        seqs = _fastest(r, [(_fake_seq(r, i, 96), 1) for i in range(q)], torch.arange(q), 5)
        one = _fastest(r, [(_fake_seq(r, 0, 96 + q - 1, q), q)], torch.arange(q), 5)
        print(f"q={q}: {q} seqs x 1 token {seqs*1e3:.2f} ms | 1 seq x {q} tokens {one*1e3:.2f} ms", flush=True)
