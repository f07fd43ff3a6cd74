"""EAGLE recipe variants on one cached data set: same data, same features, same budget each.

Run (session 11): python gen.py 4 1.0 /tmp/s11/data-r4.pkl (the target's replies, as
`train-draft` generates them), then
  python eagle_recipes.py /tmp/s11/data-r4.pkl 2.5 base,prompt            (WINDOW unset)
  WINDOW=64 python eagle_recipes.py /tmp/s11/data-r4.pkl 3 base,multi,ce
  WINDOW=64 python eagle_recipes.py /tmp/s11/data-r4.pkl 3 multi+ce
Variants: base (the session-3 recipe), prompt (loss on prompt positions too, once per prompt),
multi (fused features of layers 2 and 14 beside the final one), ce (a cross-entropy term on
the target's argmax). WINDOW: prompt positions the head trains over before the reply.
The held-out set always keeps its whole context.
"""
import json, pickle, random, sys, time
import torch, torch.nn.functional as F
from torch import nn
from specserve.layers.linear import pack_linears
from specserve.models.llama import build_model
from specserve.models.loader import load_model
from specserve.spec_decode.eagle_head import EagleHead, shift_features
from specserve.train import eagle as E
from specserve.train.batches import clip, length_batches
from specserve.train.dense_forward import dense_layer, pad_batch
from specserve.train.draft_net import select_head_ids
from specserve.train.loop import BudgetConfig, autocast, train_within_budget
from specserve.train.report import overall

data_path, minutes, variants = sys.argv[1], float(sys.argv[2]), sys.argv[3].split(",")
EXTRA_LAYERS = (2, 14)  # target layer outputs fused as extra inputs (variant "multi")
torch.manual_seed(0)
data = pickle.load(open(data_path, "rb"))
loaded = load_model(None)
target = build_model(loaded.config, loaded.state_dict, torch.float32).requires_grad_(False)
teacher = build_model(loaded.config, loaded.state_dict, torch.bfloat16).requires_grad_(False)
pack_linears(teacher)

def featurize(samples, max_context=1024, batch_tokens=8192):
    items = [F2(s.kind, *clip(s, max_context), features=torch.empty(0)) for s in samples]
    with torch.no_grad():
        for idx in length_batches(items, batch_tokens):
            batch = [items[i] for i in idx]
            ids = pad_batch([it.token_ids for it in batch])
            x = teacher.embed_tokens(ids)
            cos, sin = teacher.rotary.lookup(torch.arange(x.shape[1]))
            cos, sin = cos.to(x.dtype).unsqueeze(1), sin.to(x.dtype).unsqueeze(1)
            extra = []
            for n, layer in enumerate(teacher.layers):
                x = dense_layer(layer, x, cos, sin)
                if n in EXTRA_LAYERS:  # RMS-normalised residual stream, the final feature's scale
                    extra.append(x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype))
            hidden = teacher.norm(x)
            ex = torch.cat(extra, dim=-1)
            for row, it in enumerate(batch):
                it.features = hidden[row, :len(it.token_ids)].clone()
                it.extra = ex[row, :len(it.token_ids)].clone()
    return items

class F2(E.Featured):  # plus the extra layers' features
    __slots__ = ("extra",)

import os
WINDOW = int(os.environ.get("WINDOW", "0"))  # prompt positions kept before the reply (0: all)
cache = data_path + ".feats.pt"
t0 = time.perf_counter()
if os.path.exists(cache):
    train, held = torch.load(cache, weights_only=False)
else:
    train = featurize(data.train)
    held = featurize(data.held_out)
    torch.save((train, held), cache)
def window(it):
    if WINDOW and it.start > WINDOW:
        cut = it.start - WINDOW
        it.token_ids, it.start = it.token_ids[cut:], it.start - cut
        it.features, it.extra = it.features[cut:], it.extra[cut:]
    return it
train = [window(it) for it in train]
print(f"featurize {time.perf_counter() - t0:.0f}s; train items {len(train)}, reply positions "
      f"{sum(it.num_positions for it in train)}, all positions {sum(len(it.token_ids) for it in train)}", flush=True)
# prompt positions: only the first sample of each prompt carries them
seen = set()
for it in train:
    key = tuple(it.token_ids[:it.start + 1])
    it_loss_start = it.start if key in seen else 0
    seen.add(key)
    it.extra = (it.extra, it_loss_start)
for it in held:
    it.extra = (it.extra, it.start)
print("prompt-loss positions", sum(len(it.token_ids) - 1 - it.extra[1] for it in train), flush=True)

rng = random.Random(0)
reply_rows = torch.cat([it.features[it.start:len(it.token_ids) - 1] for it in train])
keep = sorted(rng.sample(range(len(reply_rows)), 16384))
head_ids = select_head_ids([reply_rows[torch.tensor(keep)]], target.lm_head.weight.detach(), 8192)
target_head = target.lm_head.weight.detach()[head_ids]
H = target.cfg.hidden_size

class MultiHead(EagleHead):
    def __init__(self, *a, n_extra, **k):
        super().__init__(*a, **k)
        self.fc = nn.Linear((2 + n_extra) * H, H, bias=False)
    def fuse(self, input_ids, features):
        emb = self.embed_tokens(input_ids).to(self.dtype)
        return self.fc(torch.cat([emb, features.to(emb.dtype)], dim=-1))

def make_head(multi):
    if not multi:
        return E.new_head(target, head_ids)
    n = len(EXTRA_LAYERS)
    head = MultiHead(target.cfg, target.embed_tokens, target.lm_head.weight, head_ids, torch.float32, n_extra=n)
    with torch.no_grad():
        w = torch.zeros(H, (2 + n) * H)
        w[:, :H] = 0.1 * torch.eye(H); w[:, H:2 * H] = torch.eye(H)
        head.fc.weight.copy_(w)
    head.layers[0].load_state_dict(target.layers[-1].state_dict())
    head.norm.load_state_dict(target.norm.state_dict())
    for m in (head.fc, head.layers, head.norm):
        m.requires_grad_(True)
    return head

def outputs(head, batch, multi, noise, prompt):
    T = max(len(it.token_ids) for it in batch)
    feats = torch.zeros(len(batch), T, H)
    for r, it in enumerate(batch):
        feats[r, :len(it.token_ids)] = it.features
    inputs = feats
    if multi:
        ex = torch.zeros(len(batch), T, it.extra[0].shape[1])
        for r, it in enumerate(batch):
            ex[r, :len(it.token_ids)] = it.extra[0]
        inputs = torch.cat([feats, ex], dim=-1)
    inputs = shift_features(inputs)
    if noise:
        scale = noise * float(feats.abs().mean())
        inputs = inputs + (torch.rand_like(inputs) * 2 - 1) * scale
    out = head.dense(pad_batch([it.token_ids for it in batch]), inputs)
    lo = (lambda it: it.extra[1]) if prompt else (lambda it: it.start)
    sel = lambda x: torch.cat([x[r, lo(it):len(it.token_ids) - 1] for r, it in enumerate(batch)])
    return sel(out), sel(feats)

def agreement(head, multi):
    counts = {}
    with torch.no_grad():
        for idx in length_batches(held, 8192):
            batch = [held[i] for i in idx]
            pred, _ = outputs(head, batch, multi, 0.0, False)
            guess = head.to_full_ids(head.compute_logits(pred).argmax(dim=-1))
            labels = torch.tensor([t for it in batch for t in it.token_ids[it.start + 1:]])
            sizes = [it.num_positions for it in batch]
            for it, g, lab in zip(batch, guess.split(sizes), labels.split(sizes)):
                c = counts.setdefault(it.kind, [0, 0])
                c[0] += int((g == lab).sum()); c[1] += it.num_positions
    return counts

results = {}
for v in variants:
    opts = set(v.split("+"))
    multi, prompt = "multi" in opts, "prompt" in opts
    temp = 1.0
    ce = "ce" in opts
    torch.manual_seed(0)
    head = make_head(multi)
    cfg = BudgetConfig(minutes=minutes, lr=1e-3, eval_every=50, show_progress=False)
    def step_loss(idx):
        batch = [train[i] for i in idx]
        pred, true = outputs(head, batch, multi, 0.1, prompt)
        with torch.no_grad():
            tl = (true @ target_head.T).float()
            log_p = (tl / temp).log_softmax(dim=-1)
        logits = head.compute_logits(pred)
        log_q = logits.log_softmax(dim=-1)
        loss = F.kl_div(log_q, log_p, log_target=True, reduction="batchmean")
        if ce:
            loss = loss + F.cross_entropy(logits, tl.argmax(-1))
        return loss + 0.1 * F.smooth_l1_loss(pred.float(), true.float())
    def evaluate(step):
        head.eval(); c = agreement(head, multi); head.train()
        evaluate.last = c
        return overall(c)
    loop = train_within_budget([p for p in head.parameters() if p.requires_grad],
                               list(length_batches(train, 4096)), step_loss, evaluate, cfg, random.Random(0))
    c = evaluate.last
    per = {k: round(a / n, 4) for k, (a, n) in c.items()}
    results[v] = {"all": round(overall(c), 4), **per, "steps": loop.steps,
                  "curve": [(h["step"], round(h["held_out_agreement"], 4)) for h in loop.history]}
    print(v, json.dumps(results[v]), flush=True)
json.dump(results, open(data_path + f".eagle-{minutes}m.json", "w"), indent=1)
