from h import *
C="/v1/completions"; CH="/v1/chat/completions"
M=[{"role":"user","content":"Explain speculative decoding in two sentences."}]
base=post(CH,{"messages":M,"max_tokens":40,"temperature":0},show=False).json()["choices"][0]["message"]["content"]
print("greedy", repr(base))
for sp in [0, 4, {"num_speculative_tokens":0}, {"num_speculative_tokens":3,"policy":"static"}, {"policy":"off"}, {"policy":"adaptive"}, 17, -1, "x", {"num_speculative_tokens":2,"speculation_policy":"static"}]:
    r=post(CH,{"messages":M,"max_tokens":40,"temperature":0,"speculation":sp},show=False)
    print("spec",sp,r.status_code, (r.json()["choices"][0]["message"]["content"]==base) if r.status_code==200 else r.text[:300])
# top_p tiny == greedy?
r=post(CH,{"messages":M,"max_tokens":40,"temperature":1.0,"top_p":1e-9},show=False).json(); print("top_p tiny==greedy", r["choices"][0]["message"]["content"]==base)
r=post(CH,{"messages":M,"max_tokens":40,"temperature":1.0,"top_k":1},show=False).json(); print("top_k=1==greedy", r["choices"][0]["message"]["content"]==base)
# seed repro
a=[post(C,{"prompt":"Once upon a time","max_tokens":20,"temperature":1,"seed":42},show=False).json()["choices"][0]["text"] for _ in range(2)]
print("seed repro", a[0]==a[1], repr(a[0]))
# seed n=2 vs seed+1 single
b=post(C,{"prompt":"Once upon a time","max_tokens":20,"temperature":1,"seed":42,"n":2},show=False).json()
c1=post(C,{"prompt":"Once upon a time","max_tokens":20,"temperature":1,"seed":43},show=False).json()
print("n=2 choice0 == seed42", b["choices"][0]["text"]==a[0], "choice1 == seed43", b["choices"][1]["text"]==c1["choices"][0]["text"])
# logit bias: ban token for " Paris"?
ids=None
r=post(C,{"prompt":"The capital of France is","max_tokens":3,"temperature":0,"logprobs":1},show=False).json(); print(r["choices"][0]["logprobs"]["tokens"])
