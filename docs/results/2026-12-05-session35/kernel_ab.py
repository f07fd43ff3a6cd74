"""The bf16 small-row kernel before (bb3ad07) and now (the checkout), and oneDNN's fp32 GEMM on
the weights' fp32 image (what the engine runs past the kernel's row limit), over every linear of
SmolLM2-135M: 30 layers of qkv (960 x 576), o (576 x 576), gate_up (3,072 x 576) and down
(576 x 1,536), then the tied LM head (49,152 x 576), random bf16 weights of those shapes (270 MB,
so each pass streams them from memory as a decode step does). The sides alternate, the order
flipped every repeat; per row count: the median time of each side and the median of the paired
ratios new / old [quartiles]. Checks first that both kernels agree with an fp32 reference and
that the new one gives each row the same bits alone and in the batch.

    MS=1,2,3,4,8,16,24,32,48 REPS=9 python docs/results/2026-12-05-session35/kernel_ab.py
"""
import os
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

ROOT = Path(__file__).resolve().parents[3]
CSRC = ROOT / "specserve/layers/csrc/bf16_gemv.cpp"
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-trapping-math", "-fno-signed-zeros",
         "-fassociative-math", "-fno-math-errno", "-mprefer-vector-width=512"]


def build(name: str, source: str):
    d = Path(tempfile.mkdtemp(prefix=name))
    (d / "k.cpp").write_text(source + '\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) '
                             '{ m.def("linear", &bf16_linear); }\n')
    return load(name, [str(d / "k.cpp")], extra_cflags=FLAGS, extra_ldflags=["-fopenmp"],
                build_directory=str(d)).linear


old = build("gemv_old", subprocess.run(["git", "show", "bb3ad07:specserve/layers/csrc/bf16_gemv.cpp"],
                                       cwd=ROOT, capture_output=True, text=True, check=True).stdout)
new = build("gemv_new", CSRC.read_text())
torch.manual_seed(0)
shapes = [(960, 576), (576, 576), (3072, 576), (576, 1536)]
layers = [[(torch.randn(n, k) * 0.05).bfloat16() for n, k in shapes] for _ in range(30)]
weights = [w for ws in layers for w in ws] + [(torch.randn(49152, 576) * 0.05).bfloat16()]
packed = {id(w): torch.ops.mkldnn._reorder_linear_weight(w.float(), 32) for w in weights}
op = torch.ops.mkldnn._linear_pointwise.default
none = torch.empty(0)


def dnn(x, w, _):
    return op(x.float(), packed[id(w)], None, "none", [], "").to(torch.bfloat16)


for m in (1, 3, 4, 7, 32):
    for w in weights[:4] + weights[-1:]:
        x = torch.randn(m, w.shape[1]).bfloat16()
        ref = x.float() @ w.float().T
        for fn in (old, new):
            torch.testing.assert_close(fn(x, w, none).float(), ref, rtol=2**-7, atol=1e-3)
        alone = torch.cat([new(x[i:i + 1], w, none) for i in range(m)])
        assert torch.equal(alone, new(x, w, none)), (m, w.shape)
print("checks passed")


def all_linears(fn, m: int) -> float:
    xs = {k: torch.randn(m, k).bfloat16() for k in (576, 1536)}
    t0 = time.perf_counter()
    for w in weights:
        fn(xs[w.shape[1]], w, none)
    return time.perf_counter() - t0


reps = int(os.environ.get("REPS", 9))
sides = {"old": old, "new": new, "oneDNN fp32": dnn}
print(f"{reps} repeats; ms for all linears of the model, median")
print(f"{'rows':>4} {'old':>8} {'new':>8} {'oneDNN':>8}  new/old paired [quartiles]  new/oneDNN")
for m in (int(s) for s in os.environ.get("MS", "1,2,3,4,8,16,24,32,48").split(",")):
    t = {s: [] for s in sides}
    for r in range(reps):
        for s in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            t[s].append(all_linears(sides[s], m))
    med = {s: sorted(v)[reps // 2] * 1e3 for s, v in t.items()}
    rr = sorted(a / b for a, b in zip(t["new"], t["old"], strict=True))
    print(f"{m:4d} {med['old']:8.2f} {med['new']:8.2f} {med['oneDNN fp32']:8.2f}  "
          f"{rr[reps // 2]:.3f} [{rr[reps // 4]:.3f}, {rr[3 * reps // 4]:.3f}]"
          f"       {med['new'] / med['oneDNN fp32']:.3f}", flush=True)
