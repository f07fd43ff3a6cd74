import time, torch, os, sys
from torch.utils.cpp_extension import load
ext = load("gemvproto", ["/tmp/gemv_proto/proto.cpp"], extra_cflags=["-O3","-march=native","-fopenmp","-fno-trapping-math","-fno-signed-zeros","-fassociative-math","-fno-math-errno"], extra_ldflags=["-fopenmp"], build_directory="/tmp/gemv_proto/build", verbose=False)
torch.manual_seed(0)
shapes = [(960,576),(576,576),(3072,576),(576,1536)]
layers = [[(torch.randn(n,k)*0.05).bfloat16() for n,k in shapes] for _ in range(30)]
head = (torch.randn(49152,576)*0.05).bfloat16()
# correctness vs fp32 reference and batch invariance
ext.set_scheme(int(os.environ.get("SCHEME","0"))); ext.set_m3(int(os.environ.get("M3","0")))
for M in (1,2,3,4,5,7,8,12):
    for w in layers[0] + [head]:
        x = torch.randn(M, w.shape[1]).bfloat16()
        ref = (x.float() @ w.float().T)
        a, b = ext.v1(x, w, torch.Tensor()), ext.v2(x, w, torch.Tensor())
        err = (b.float()-ref).abs().max().item(); err1 = (a.float()-ref).abs().max().item()
        assert err <= 2*max(err1, 1e-2), (M, w.shape, err, err1)
        b1 = torch.cat([ext.v2(x[i:i+1], w, torch.Tensor()) for i in range(M)])
        assert torch.equal(b1, b), ("batch variance", M, w.shape)
print("ok correctness")
import os
if os.environ.get("SCHEME"): ext.set_scheme(int(os.environ["SCHEME"]))
DNN = bool(os.environ.get("DNN"))
if DNN:
    packed = {}
    for ws in layers + [[head]]:
        for w in ws: packed[id(w)] = torch.ops.mkldnn._reorder_linear_weight(w.float(), 32)
    op = torch.ops.mkldnn._linear_pointwise.default
    def dnn(x, w, b):
        return op(x.float(), packed[id(w)], None, "none", [], "").to(torch.bfloat16)
def model(fn, M):
    xs = {k: torch.randn(M, k).bfloat16() for k in (576,1536)}
    for ws in layers:
        for w in ws: fn(xs[w.shape[1]], w, torch.Tensor())
    fn(xs[576], head, torch.Tensor())
reps = int(os.environ.get("REPS", "7"))
print("M  v1_ms  v2_ms  v2/v1")
MS = [int(m) for m in os.environ.get("MS","1,2,3,4,5,6,8,10,12,16").split(",")]
for M in MS:
    names = ["v1", "v2"] + (["dnn"] if DNN else [])
    t = {n: [] for n in names}
    for r in range(reps):
        for name in (names if r % 2 == 0 else names[::-1]):
            fn = dnn if name == "dnn" else getattr(ext, name)
            t0 = time.perf_counter(); model(fn, M); t[name].append(time.perf_counter()-t0)
    med = {n: sorted(v)[reps//2]*1e3 for n, v in t.items()}
    rr = sorted(a / b for a, b in zip(t["v2"], t["v1"]))
    print(f"{M:2d} " + " ".join(f"{n} {med[n]:6.2f}" for n in names) + f"  v2/v1 {med['v2']/med['v1']:.3f} paired {rr[len(rr)//2]:.3f} [{rr[len(rr)//4]:.3f},{rr[3*len(rr)//4]:.3f}]" + (f" v2/dnn {med['v2']/med['dnn']:.3f}" if DNN else ""), flush=True)
