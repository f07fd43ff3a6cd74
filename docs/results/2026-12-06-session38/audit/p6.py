from h import *
CH="/v1/chat/completions"
M=[{"role":"user","content":"Explain speculative decoding in two sentences."}]
g=post(CH,{"messages":M,"max_tokens":40,"temperature":0,"logprobs":True,"top_logprobs":3},show=False).json()["choices"][0]
for kw in [{"temperature":1.0,"top_k":1},{"temperature":1.0,"top_p":1e-9},{"temperature":0.01}, {"temperature":1e-6}]:
  k=post(CH,dict({"messages":M,"max_tokens":40,"logprobs":True,"top_logprobs":3},**kw),show=False).json()["choices"][0]
  gt=[t["token"] for t in g["logprobs"]["content"]]; kt=[t["token"] for t in k["logprobs"]["content"]]
  i=next((i for i,(a,b) in enumerate(zip(gt,kt)) if a!=b),None)
  print(kw,"diverge at",i)
  if i is not None:
    print(" greedy tok",g["logprobs"]["content"][i]); print(" other tok",k["logprobs"]["content"][i])
