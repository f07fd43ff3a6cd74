"""Builds of the CPU extension's paged attention from several source trees, timed side by side in
one process (alternating, median of 11 rounds): 30 layers of KV pools read cold, as a forward
reads them, shuffled block tables, SmolLM2 shapes (9 heads, 3 KV heads, head_dim 64, bf16,
block 16). Outputs must be identical across the trees. The ratio is the first tree's time over
each tree's (> 1: faster than the first).
usage: .venv/bin/python attention_prefetch_ab.py TREE [TREE ...]   (a tree: a checkout, or a copy of
specserve/ with a modified specserve/layers/csrc/; ~25 s of build per tree, then ~1 min)"""
import sys, time, statistics
from pathlib import Path
import torch
from torch.utils.cpp_extension import load_inline
sys.path.insert(0, sys.argv[1])
from specserve.layers import paged_attention_ext as pe  # the new tree's build settings
torch.set_num_threads(2)
mods = {}


def build_dir(tag):
    d = Path(f'/tmp/s10/ab_build_{tag}')
    d.mkdir(exist_ok=True)
    return str(d)


TAGS = [Path(a).name for a in sys.argv[1:]]
for tag, repo in zip(TAGS, sys.argv[1:]):
    src = "\n".join((Path(repo) / "specserve/layers/csrc" / f.name).read_text() for f in pe._SOURCE_PATHS
                    if (Path(repo) / "specserve/layers/csrc" / f.name).exists())
    mods[tag] = load_inline(name=f"attn_ab_{tag}_{abs(hash(src)) % 10**8}", cpp_sources=[src], functions=pe._FUNCTIONS,
                            extra_cflags=pe._CFLAGS, extra_ldflags=pe._LDFLAGS, no_implicit_headers=True,
                            build_directory=build_dir(tag))
H, KVH, D, BS, L = 9, 3, 64, 16, 30
empty = torch.empty(0, dtype=torch.bfloat16)
for conc, ctx, qlen in ((32, 136, 1), (64, 136, 1), (64, 256, 1), (32, 136, 5)):
    blocks_per = (ctx + BS - 1) // BS
    nblocks = conc * blocks_per + 8
    g = torch.Generator().manual_seed(0)
    caches = [(torch.randn(nblocks * BS, KVH, D, generator=g).bfloat16(), torch.randn(nblocks * BS, KVH, D, generator=g).bfloat16()) for _ in range(L)]
    bt = torch.randperm(nblocks, generator=g)[: conc * blocks_per].view(conc, blocks_per).to(torch.int32).contiguous()
    token_seq = torch.arange(conc, dtype=torch.int32).repeat_interleave(qlen)
    token_pos = torch.cat([torch.arange(ctx - qlen, ctx, dtype=torch.int32) for _ in range(conc)])
    q = torch.randn(conc * qlen, H, D).bfloat16()
    outs = {t: m.paged_attention_short(q, caches[0][0], caches[0][1], bt, token_seq, token_pos, BS, 0.125, 0, empty, empty, 0) for t, m in mods.items()}
    assert all(torch.equal(outs[TAGS[0]], o) for o in outs.values()), "outputs differ"
    times = {t: [] for t in TAGS}
    for rnd in range(11):
        for tag in (TAGS if rnd % 2 == 0 else TAGS[::-1]):
            m = mods[tag]
            t = time.perf_counter()
            for k, v in caches:
                m.paged_attention_short(q, k, v, bt, token_seq, token_pos, BS, 0.125, 0, empty, empty, 0)
            times[tag].append((time.perf_counter() - t) * 1e3)
    base = statistics.median(times[TAGS[0]])
    print(f"conc {conc:>2} ctx {ctx} q {qlen}: " + "  ".join(f"{t} {statistics.median(v):.2f}ms ({base / statistics.median(v):.3f})" for t, v in times.items()), flush=True)
