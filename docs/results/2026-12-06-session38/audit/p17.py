import httpx, json, time, threading, os, signal
U="http://127.0.0.1:8765"
pid=int(open("/tmp/audit/serve.pid").read())
out={}
def long_stream():
    evs=[]
    try:
        with httpx.stream("POST",U+"/v1/chat/completions",json={"messages":[{"role":"user","content":"Write a long story."}],"max_tokens":3000,"temperature":0,"ignore_eos":True,"stream":True},timeout=120) as r:
            for line in r.iter_lines():
                if line: evs.append(line)
    except Exception as e: evs.append("EXC "+repr(e))
    out["s"]=evs
def long_plain():
    try:
        r=httpx.post(U+"/v1/completions",json={"prompt":"Write","max_tokens":3000,"ignore_eos":True},timeout=120); out["p"]=(r.status_code,r.text[:300])
    except Exception as e: out["p"]="EXC "+repr(e)
ts=[threading.Thread(target=long_stream),threading.Thread(target=long_plain)]
[t.start() for t in ts]
time.sleep(3)
t0=time.time(); os.kill(pid, signal.SIGTERM)
[t.join() for t in ts]
print("clients done after", round(time.time()-t0,1))
print("stream last:", [e[:250] for e in out["s"][-3:]])
print("plain:", out["p"])
while os.path.exists(f"/proc/{pid}"): time.sleep(0.2)
print("exit after", round(time.time()-t0,1), "rc", open("/tmp/audit/serve3.rc").read().strip() if os.path.exists("/tmp/audit/serve3.rc") else None)
