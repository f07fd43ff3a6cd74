import threading, httpx
from h import *
C="/v1/completions"
P=" ".join(["word%d"%i for i in range(100)])
r=post(C,{"prompt":P,"max_tokens":5,"temperature":0},show=False); print(r.status_code, r.text[:300])
pt=r.json()["usage"]["prompt_tokens"] if r.status_code==200 else None
res={}
def go(i):
    r=httpx.post(U+C,json={"prompt":P+f" {i}","max_tokens":352-pt-5,"temperature":0,"ignore_eos":True},timeout=300); res[i]=(r.status_code, r.json().get("usage") if r.status_code==200 else r.text[:200], r.json()["choices"][0]["finish_reason"] if r.status_code==200 else None)
ts=[threading.Thread(target=go,args=(i,)) for i in range(3)]
t0=time.time(); [t.start() for t in ts]; [t.join() for t in ts]
print(res, round(time.time()-t0,1),"s")
print({k:v for k,v in c.get(U+"/stats").json().items() if k in ("num_preemptions","kv_blocks_free","num_running","num_waiting")})
r=post("/v1/chat/completions",{"messages":[{"role":"user","content":P}],"temperature":0,"ignore_eos":True},show=False); print(r.status_code, r.json().get("usage"), r.json()["choices"][0]["finish_reason"])
