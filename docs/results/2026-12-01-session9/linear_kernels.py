"""One linear (576 -> 1536, SmolLM2's gate/up shape) timed through every CPU path torch offers,
at 1..256 rows, 2 threads: what decides the engine's precision on a CPU without bf16 GEMMs.
Run: .venv/bin/python docs/results/2026-12-01-session9/linear_kernels.py  (~1 min)
Hot caches (one weight reused), so the 1-row figures are L2/L3 figures, not DRAM ones."""
import torch, time
torch.set_num_threads(2)
def bench(f, n=30):
    for _ in range(3): f()
    t=time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter()-t)/n
K, N = 576, 1536
w = torch.randn(N, K)
res = {}
for m in (1, 4, 16, 32, 64, 256):
    row = {}
    x32 = torch.randn(m, K); xb = x32.bfloat16()
    row['fp32 F.linear'] = bench(lambda: torch.nn.functional.linear(x32, w))
    try:
        p32 = torch.ops.mkldnn._reorder_linear_weight(w, 32)
        row['fp32 mkldnn packed'] = bench(lambda: torch.ops.mkldnn._linear_pointwise(x32, p32, None, "none", [], ""))
    except Exception as e: row['fp32 mkldnn packed'] = float('nan'); print(e)
    try:
        pm = torch.ops.mkl._mkl_reorder_linear_weight(w, m)
        row['fp32 mkl packed'] = bench(lambda: torch.ops.mkl._mkl_linear(x32, pm, w, None, m))
    except Exception as e: row['fp32 mkl packed'] = float('nan'); print('mkl', e)
    wb = w.bfloat16()
    row['bf16 F.linear'] = bench(lambda: torch.nn.functional.linear(xb, wb), n=5)
    row['bf16->fp32 upcast'] = bench(lambda: torch.nn.functional.linear(xb.float(), w).bfloat16())
    q = torch.randint(-127, 127, (N, K), dtype=torch.int8); s = torch.rand(N).bfloat16()
    row['int8pack bf16 act'] = bench(lambda: torch._weight_int8pack_mm(xb, q, s))
    row['int8pack fp32 act'] = bench(lambda: torch._weight_int8pack_mm(x32, q, s.float()), n=5)
    try:
        wi = torch.randint(0, 16, (N, K), dtype=torch.int32)
        packed = torch._convert_weight_to_int4pack_for_cpu(wi, 1)
        sz = torch.rand(K//32, N, 2).bfloat16()
        row['int4pack bf16 act'] = bench(lambda: torch._weight_int4pack_mm_for_cpu(xb, packed, 32, sz))
    except Exception as e: print('int4', e)
    print(m, {k: f"{v*1e6:.0f}us/{2*m*K*N/v/1e9:.0f}GF" for k, v in row.items()}, flush=True)
