import threading, httpx
from h import *
H={"Authorization":"Bearer secret"}
c.headers.update(H)
CH="/v1/chat/completions"; C="/v1/completions"
P="List: apple, banana, cherry, apple, banana, cherry, apple, banana, cherry, apple, banana,"
outs={}
for sp in [0, None, 4, {"num_speculative_tokens":4,"policy":"static"}, {"policy":"off"}]:
    body={"prompt":P,"max_tokens":40,"temperature":0,"logprobs":1}
    if sp is not None: body["speculation"]=sp
    r=post(C,body,show=False).json(); outs[str(sp)]=r["choices"][0]["text"]; print(sp, repr(r["choices"][0]["text"][:80]), r["usage"], len(r["choices"][0]["logprobs"]["tokens"]))
print("all equal:", len(set(outs.values()))==1)
st=c.get(U+"/stats").json(); print({k:st[k] for k in ("num_draft_tokens","num_accepted_tokens","spec_method","num_verifications")})
import re
m=c.get(U+"/metrics").text; print([l for l in m.splitlines() if "spec_decode" in l and not l.startswith("#")])
# sampled with seed + speculation: reproducible?
a=[post(C,{"prompt":P,"max_tokens":30,"temperature":0.8,"seed":5,"speculation":{"num_speculative_tokens":4,"policy":"static"}},show=False).json()["choices"][0]["text"] for _ in range(2)]
b=post(C,{"prompt":P,"max_tokens":30,"temperature":0.8,"seed":5,"speculation":0},show=False).json()["choices"][0]["text"]
print("seeded spec repro", a[0]==a[1], "== nospec", a[0]==b)
# stream with stream-interval 3 + speculation: text concatenation equals non-stream
s,ev,raw=sse(C,{"prompt":P,"max_tokens":40,"temperature":0,"stream_options":{"include_usage":True}},show=False)
txt="".join(e["choices"][0]["text"] for e in ev if e!="[DONE]" and e["choices"]); print("stream==nonstream", txt==outs["None"], "chunks", len(ev), "usage", ev[-2]["usage"])
s,ev,raw=sse(C,{"prompt":P,"max_tokens":40,"temperature":0,"logprobs":1},show=False)
toks=sum(len(e["choices"][0]["logprobs"]["tokens"]) for e in ev if e!="[DONE]" and e["choices"]); print("stream logprob tokens", toks)
# n too large
post(C,{"prompt":"hi","max_tokens":3,"n":4})
# 429
res=[]
def go():
    r=httpx.post(U+C,json={"prompt":"Write","max_tokens":60},headers=H,timeout=120); res.append(r.status_code)
ts=[threading.Thread(target=go) for _ in range(5)]
[t.start() for t in ts]; [t.join() for t in ts]; print("statuses", sorted(res))
r=httpx.post(U+C,json={"prompt":"Write","max_tokens":60},headers=H,timeout=120) 
