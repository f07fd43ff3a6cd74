import httpx, json, time, threading
from h import *
CH="/v1/chat/completions"
# disconnect mid-stream
with httpx.Client(timeout=60) as cl:
    with cl.stream("POST", U+CH, json={"messages":[{"role":"user","content":"Write a long story."}],"max_tokens":2000,"temperature":0,"stream":True}) as r:
        n=0
        for line in r.iter_lines():
            n+=1
            if n>10: break
time.sleep(1.5)
st=c.get(U+"/stats").json(); print("after disconnect: running",st["num_running"],"free",st["kv_blocks_free"],st["kv_blocks_total"],"inflight",st["num_requests_in_flight"])
r=post(CH,{"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"temperature":0})
# non-stream disconnect
try:
    httpx.post(U+CH,json={"messages":[{"role":"user","content":"Write a long story."}],"max_tokens":2000,"temperature":0},timeout=2)
except httpx.ReadTimeout: print("client timeout")
time.sleep(1.5)
st=c.get(U+"/stats").json(); print("after nonstream disconnect: running",st["num_running"],"free",st["kv_blocks_free"],"inflight",st["num_requests_in_flight"])
# concurrent requests: greedy stability under batching
M=[{"role":"user","content":"Tell me about the moon."}]
solo=post(CH,{"messages":M,"max_tokens":30,"temperature":0},show=False).json()["choices"][0]["message"]["content"]
res=[None]*6
def go(i):
    body={"messages":M if i%2==0 else [{"role":"user","content":f"Question {i}: what is {i}+{i}?"}],"max_tokens":30,"temperature":0}
    res[i]=httpx.post(U+CH,json=body,timeout=120).json()["choices"][0]["message"]["content"]
ts=[threading.Thread(target=go,args=(i,)) for i in range(6)]
[t.start() for t in ts]; [t.join() for t in ts]
print("batched greedy equal solo:", [res[i]==solo for i in (0,2,4)])
if res[0]!=solo: print(repr(solo)); print(repr(res[0]))
