import time, torch
torch.manual_seed(0)
op = torch.ops.mkldnn._linear_pointwise.default
for n,k in [(960,576),(576,576),(3072,576),(576,1536)]:
    w=(torch.randn(n,k)*0.05).bfloat16()
    ps={h: torch.ops.mkldnn._reorder_linear_weight(w, h) for h in (32, 512, 2048)}
    for rows in (128, 512, 2048):
        x=torch.randn(rows,k).bfloat16()
        ref = op(x, ps[32], None, "none", [], "")
        out=[]
        for h,p in ps.items():
            y=op(x,p,None,"none",[],"")
            same = torch.equal(y, ref)
            for _ in range(3): op(x,p,None,"none",[],"")
            it=max(5,int(20000/rows)); s=time.perf_counter()
            for _ in range(it): op(x,p,None,"none",[],"")
            t=(time.perf_counter()-s)/it
            out.append(f"hint{h} {t*1e3:6.3f}ms{'' if same else '*'}")
        print(f"{n}x{k} rows {rows}: " + "  ".join(out), flush=True)
