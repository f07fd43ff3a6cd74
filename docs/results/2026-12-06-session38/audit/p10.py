from h import *
C="/v1/completions"; CH="/v1/chat/completions"
for body in [{"prompt":"Emoji list: 😀 😃 😄 🎉 ","max_tokens":40,"temperature":0},{"prompt":"日本語の文章: 東京は","max_tokens":40,"temperature":0}]:
    ns=post(C,body,show=False).json()["choices"][0]["text"]
    s,ev,raw=sse(C,body,show=False)
    st="".join(e["choices"][0]["text"] for e in ev if e!="[DONE]" and e["choices"])
    print("equal:",ns==st, repr(ns)); 
    if ns!=st: print("  stream:",repr(st))
    print("  deltas with U+FFFD:", [e["choices"][0]["text"] for e in ev if e!="[DONE]" and "\ufffd" in e["choices"][0]["text"]])
    r=post(C,dict(body,logprobs=1),show=False).json()["choices"][0]["logprobs"]
    print("  tokens:", r["tokens"][:12], "offsets", r["text_offset"][:12])
    print("  sum(len tokens)==len(text)?", sum(map(len,r["tokens"]))==len(ns), sum(map(len,r["tokens"])), len(ns))
body={"messages":[{"role":"user","content":"Reply with three emoji: 😀 🎉 🚀"}],"max_tokens":20,"temperature":0,"logprobs":True}
r=post(CH,body,show=False).json()["choices"][0]
print(repr(r["message"]["content"]))
print([(t["token"],t["bytes"]) for t in r["logprobs"]["content"]][:10])
allb=b"".join(bytes(t["bytes"]) for t in r["logprobs"]["content"]); print("bytes concat decodes to content:", allb.decode("utf-8","replace")==r["message"]["content"], allb)
