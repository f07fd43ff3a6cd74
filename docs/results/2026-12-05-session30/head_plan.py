import os, time, torch
from specserve import LLM
from specserve.models import layer_loop as LL
from specserve.layers import paged_attention_ext
from specserve.spec_decode.profiler import _fake_seq
from specserve.models.layer_loop import _encode
from specserve.quant import int4
d = os.path.expanduser("~/.cache/specserve/drafts/s27-eagle")
llm = LLM(speculative_config={"method": "eagle", "model": d}, speculation_policy="adaptive")
prop = llm.engine.proposer
runner = prop.runner; head = runner.model
layer = head.layers[0]; cache = runner.kv_caches[0]
dtype = head.dtype
tensors, ints = [], []
lins = [_encode(m, dtype) for m in (layer.attn.qkv_proj, layer.attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)]
print("encodable", [l is not None for l in lins])
tensors += [layer.input_norm.weight.detach(), layer.post_attn_norm.weight.detach()]
for ts, ks in lins:
    tensors += [t.detach() for t in ts]; ints += ks
tensors += [cache.k, cache.v, cache.k_scale, cache.v_scale]
ext = paged_attention_ext.module()
pid = ext.register_layer_plan(tensors, ints, head.cfg.num_heads, cache.kernel_format, runner.block_size, head.cfg.rms_norm_eps, layer.attn.scale, int4.INT4_KERNEL_MAX_ROWS)
for S in (1, 32):
    shape = [(_fake_seq(runner, i, 64), 1) for i in range(S)]
    inputs = runner.prepare(shape); meta = inputs.meta; g = meta.groups[0]
    x = torch.randn(S, head.cfg.hidden_size).to(dtype)
    cos, sin = head.rotary.lookup(inputs.positions)
    with torch.inference_mode():
        a, ra = layer(x.clone(), None, cos, sin, cache, meta)
        b, rb, _ = ext.run_layer_plan(pid, x.clone(), cos, sin, meta.slot_mapping, g.block_tables, g.token_seq, g.token_pos, [])
        print(S, "equal:", torch.equal(a, b), torch.equal(ra, rb))
        for name, f in (("python", lambda: layer(x, None, cos, sin, cache, meta)), ("plan", lambda: ext.run_layer_plan(pid, x, cos, sin, meta.slot_mapping, g.block_tables, g.token_seq, g.token_pos, []))):
            for _ in range(20): f()
            t = time.perf_counter()
            for _ in range(300): f()
            print(f"  S={S} {name}: {(time.perf_counter()-t)/300*1e6:.0f} us")
        t = time.perf_counter()
        for _ in range(300): head(inputs.input_ids, inputs.positions, runner.kv_caches, meta)
        print(f"  S={S} whole head forward (python): {(time.perf_counter()-t)/300*1e6:.0f} us")
        hid = head(inputs.input_ids, inputs.positions, runner.kv_caches, meta)
        t = time.perf_counter()
        for _ in range(300): head.compute_logits(hid, float32=False)
        print(f"  S={S} head lm_head: {(time.perf_counter()-t)/300*1e6:.0f} us")
