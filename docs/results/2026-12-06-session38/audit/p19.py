import httpx, time, threading, os, signal
U="http://127.0.0.1:8765"; H={"Authorization":"Bearer envkey"}
pid=int(open("/tmp/audit/serve.pid").read()); out={}
def ls():
    evs=[]
    try:
        with httpx.stream("POST",U+"/v1/chat/completions",headers=H,json={"messages":[{"role":"user","content":"Write a long story."}],"max_tokens":3000,"ignore_eos":True,"stream":True},timeout=120) as r:
            for line in r.iter_lines():
                if line: evs.append(line)
    except Exception as e: evs.append("EXC "+repr(e))
    out["s"]=evs
t=threading.Thread(target=ls); t.start(); time.sleep(3)
t0=time.time(); os.kill(pid, signal.SIGINT); time.sleep(1); os.kill(pid, signal.SIGINT)
t.join(); print("client done after", round(time.time()-t0,1), [e[:200] for e in out["s"][-2:]])
while os.path.exists(f"/proc/{pid}"): time.sleep(0.2)
time.sleep(0.5); print("exit after", round(time.time()-t0,1), "rc", open("/tmp/audit/serve5.rc").read().strip())
