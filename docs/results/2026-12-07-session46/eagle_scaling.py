"""#8: does held-out agreement grow with prompt diversity or with reply volume?
One data set (4 replies per train prompt), featurized once; heads trained for the same budget on
subsets: by prompts (all their replies) and by replies (all prompts)."""
import os, random, time, json, gc
import torch
from specserve.train.data import DataConfig, workload_prompts
from specserve.train.pipeline import generate_data, _teacher
from specserve.models.loader import load_model
from specserve.models.llama import build_model
from specserve.train import eagle as E
from specserve.train.batches import length_batches
from specserve.train.draft_net import select_head_ids
from specserve.train.loop import train_within_budget, autocast
from specserve.train.report import overall

MIN = float(os.environ.get("MIN", "4"))
RUNS = os.environ.get("RUNS", "p100r4,p50r4,p100r2,p25r4,p100r1").split(",")
t0 = time.perf_counter()
data = generate_data(None, workload_prompts("prose,json,sql,rag"), DataConfig(), 0, None)
print(f"data {len(data.train)} train / {len(data.held_out)} held-out, {time.perf_counter()-t0:.0f} s", flush=True)
loaded = load_model(None)
model = build_model(loaded.config, loaded.state_dict, torch.float32).requires_grad_(False)
teacher = _teacher(loaded, model, "auto")
cfg = E.EagleConfig(minutes=MIN, show_progress=False)
layers = E.default_feature_layers(model.cfg.num_layers)
t1 = time.perf_counter()
train_items = E.featurize(teacher, data.train, cfg.max_context, layers, cfg.head_context)
held = E.featurize(teacher, data.held_out, None, layers, cfg.head_context)
print(f"featurized in {time.perf_counter()-t1:.0f} s", flush=True)
del teacher; gc.collect()
# group train items by prompt
groups = {}
for i, s in enumerate(data.train):
    groups.setdefault(tuple(s.token_ids[:s.prompt_len]), []).append(i)
keys = list(groups); random.Random(1).shuffle(keys)
print(f"{len(keys)} train prompts", flush=True)
h = model.cfg.hidden_size
results = {}
for run in RUNS:
    pf = int(run[1:run.index("r")]) / 100; nr = int(run[run.index("r") + 1:])
    chosen = keys[:max(1, round(len(keys) * pf))]
    idx = [i for k in chosen for i in groups[k][:nr]]
    items = [train_items[i] for i in idx]
    torch.manual_seed(0); rng = random.Random(0)
    rows = torch.cat([it.features[it.start:len(it.token_ids) - 1, :h] for it in items])
    if len(rows) > cfg.head_mass_positions:
        rows = rows[torch.tensor(sorted(rng.sample(range(len(rows)), cfg.head_mass_positions)))]
    head_ids = select_head_ids([rows], model.lm_head.weight.detach(), cfg.head_vocab)
    head = E.new_head(model, head_ids, layers, cfg.head_context)
    th = model.lm_head.weight.detach()[head_ids] if head_ids is not None else model.lm_head.weight.detach()
    def evaluate(step):
        head.eval(); c = E.agreement(head, held); head.train(); return overall(c)
    loop = train_within_budget([p for p in head.parameters() if p.requires_grad],
                               list(length_batches(items, cfg.batch_tokens)),
                               lambda b: E._step_loss(head, th, [items[i] for i in b], cfg),
                               evaluate, cfg, rng)
    head.eval()
    with torch.no_grad(), autocast(cfg):
        per_kind = E.agreement(head, held)
        sub = random.Random(2).sample(items, min(300, len(items)))
        train_agree = overall(E.agreement(head, sub))
    positions = sum(it.num_positions for it in items)
    r = {"prompts": len(chosen), "replies": len(items), "positions": positions, "steps": loop.steps,
         "held_out": overall(per_kind), "train_agreement": train_agree,
         "per_kind": {k: round(c[0] / c[1], 3) for k, c in per_kind.items()},
         "curve": [(e["step"], round(e["held_out_agreement"], 3)) for e in loop.history][::3]}
    results[run] = r
    print(run, json.dumps(r), flush=True)
print(f"total {time.perf_counter()-t0:.0f} s")
