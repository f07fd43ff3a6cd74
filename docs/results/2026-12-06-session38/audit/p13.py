import threading, httpx
from h import *
H={"Authorization":"Bearer secret"}; c.headers.update(H)
C="/v1/completions"
P="List: apple, banana, cherry, apple, banana, cherry, apple, banana, cherry, apple, banana,"
body={"prompt":P,"max_tokens":40,"temperature":0.7,"seed":11}
solo=[post(C,body,show=False).json()["choices"][0]["text"] for _ in range(2)]
print("solo repro", solo[0]==solo[1]); print(repr(solo[0]))
def bg():
    httpx.post(U+C,json={"prompt":"Tell me a long story about dragons.","max_tokens":80,"temperature":1.0},headers=H,timeout=120)
res=[]
for k in range(3):
    t=threading.Thread(target=bg); t.start(); time.sleep(0.3)
    res.append(post(C,body,show=False).json()["choices"][0]["text"]); t.join()
print("under load equal to solo:", [r==solo[0] for r in res])
for r in res:
    if r!=solo[0]: print(repr(r))
st=c.get(U+"/stats").json(); print({k:st[k] for k in ("num_draft_tokens","num_accepted_tokens","num_verifications")})
