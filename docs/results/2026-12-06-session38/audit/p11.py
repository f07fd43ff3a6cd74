import httpx, json, time, threading, os, signal, subprocess
U="http://127.0.0.1:8765"
pid=int(open("/tmp/audit/serve.pid").read())
out={}
def long():
    evs=[]
    try:
        with httpx.stream("POST",U+"/v1/chat/completions",json={"messages":[{"role":"user","content":"Write a long story."}],"max_tokens":150,"temperature":0,"stream":True,"stream_options":{"include_usage":True}},timeout=120) as r:
            for line in r.iter_lines():
                if line: evs.append(line)
    except Exception as e: evs.append("EXC "+repr(e))
    out["evs"]=evs
t=threading.Thread(target=long); t.start()
time.sleep(2)
t0=time.time()
os.kill(pid, signal.SIGTERM)
time.sleep(0.5)
try:
    r=httpx.post(U+"/v1/chat/completions",json={"messages":[{"role":"user","content":"hi"}],"max_tokens":3},timeout=10); print("new request during drain:", r.status_code, r.text[:200])
except Exception as e: print("new request during drain: EXC", repr(e))
try:
    r=httpx.get(U+"/health",timeout=5); print("health during drain:", r.status_code, r.text[:200])
except Exception as e: print("health during drain: EXC", repr(e))
t.join()
evs=out["evs"]
print("events", len(evs), "last3", [e[:200] for e in evs[-3:]])
for _ in range(60):
    try: os.kill(pid,0); time.sleep(0.5)
    except ProcessLookupError: break
print("exited after", round(time.time()-t0,1),"s")
