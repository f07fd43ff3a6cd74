"""Session 7: how well step-time models fit steps.json (decode/verify steps only): the
profiled token curve alone, with a scale, and with the two context terms.
Usage: python step_costs_fit.py   (after step_costs.py)"""
import json, numpy as np
d = json.load(open("steps.json"))
X = np.array([[r["n"], r["ctx"], r["qctx"], r["nseq"], r["npre"], r["pred"], r["t"]] for r in d])
dec = X[X[:,4] == 0]
n, ctx, qctx, nseq, pre, pred, t = dec.T
one = np.ones_like(t)
def fit(name, A):
    coef = np.linalg.lstsq(A / t[:,None], one, rcond=None)[0]  # relative least squares
    res = (t - A @ coef) / t
    print(f"{name:28s} coef {coef}  mean|rel| {np.mean(np.abs(res)):.3f}  p90 {np.quantile(np.abs(res),.9):.3f}")
    return coef
fit("b*pred", np.c_[pred])
fit("a+b*pred", np.c_[one, pred])
fit("b*pred+c*ctx", np.c_[pred, ctx])
fit("b*pred+d*qctx", np.c_[pred, qctx])
c = fit("b*pred+c*ctx+d*qctx", np.c_[pred, ctx, qctx])
fit("a+b*pred+c*ctx+d*qctx", np.c_[one, pred, ctx, qctx])
# residual by group for the best
import collections
A = np.c_[pred, ctx, qctx]
g = collections.defaultdict(list)
rows = [r for r in d if r["npre"] == 0]
for r, p in zip(rows, A @ c):
    g[(r["wl"], r["conc"], r["pol"])].append(r["t"] / p)
for k, v in g.items(): print(k, "actual/model median %.2f" % np.median(v))
