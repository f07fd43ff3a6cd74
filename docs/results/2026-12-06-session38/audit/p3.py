from h import *
C="/v1/completions"; CH="/v1/chat/completions"
M=[{"role":"user","content":"Name three colors."}]
def summarize(evs):
    for e in evs:
        if e=="[DONE]": print("  [DONE]"); continue
        if "error" in e: print("  ERR", e); continue
        print("  ", json.dumps([{k:v for k,v in ch.items() if k in("index","delta","text","finish_reason","stop_reason")} for ch in e["choices"]]), "usage=",e.get("usage"))
# full greedy text
r=post(CH,{"messages":M,"max_tokens":30,"temperature":0}, show=False).json(); print(repr(r["choices"][0]["message"]["content"]))
# stop string spanning tokens: ". Red\n2" spans tokens
for stop in [". Red\n2", "d\n2. B", ["zzz","ed\n2"]]:
    s,ev,raw=sse(CH,{"messages":M,"max_tokens":30,"temperature":0,"stop":stop,"stream_options":{"include_usage":True}},show=False)
    txt="".join(e["choices"][0]["delta"].get("content","") for e in ev if e!="[DONE]" and e["choices"])
    fr=[e["choices"][0]["finish_reason"] for e in ev if e!="[DONE]" and e["choices"] and e["choices"][0]["finish_reason"]]
    nons=post(CH,{"messages":M,"max_tokens":30,"temperature":0,"stop":stop},show=False).json()
    print("stop",repr(stop),"stream:",repr(txt),fr,"usage",ev[-2].get("usage"),"| nonstream:",repr(nons["choices"][0]["message"]["content"]),nons["choices"][0]["finish_reason"],nons["usage"])
print("n=2 stream chat")
s,ev,raw=sse(CH,{"messages":M,"max_tokens":4,"temperature":1,"seed":3,"n":2,"stream_options":{"include_usage":True}},show=False); summarize(ev)
print("n=2 stream completions")
s,ev,raw=sse(C,{"prompt":"Hello","max_tokens":4,"temperature":1,"seed":3,"n":2,"stream_options":{"include_usage":True}},show=False); summarize(ev)
print("stream completion logprobs")
s,ev,raw=sse(C,{"prompt":"Hello","max_tokens":4,"temperature":0,"logprobs":1},show=False); print(raw)
print("stream chat logprobs")
s,ev,raw=sse(CH,{"messages":M,"max_tokens":3,"temperature":0,"logprobs":True,"top_logprobs":1},show=False); print(raw)
print("continuous usage")
s,ev,raw=sse(CH,{"messages":M,"max_tokens":3,"temperature":0,"stream_options":{"include_usage":True,"continuous_usage_stats":True}},show=False); summarize(ev)
print("stream without include_usage")
s,ev,raw=sse(CH,{"messages":M,"max_tokens":2,"temperature":0},show=False); print(raw)
