from h import *
import re, httpx
def metric(name, text=None):
    text=text or c.get(U+"/metrics").text
    return {l.split(" ")[0]:float(l.split(" ")[1]) for l in text.splitlines() if l.startswith(name)}
before=c.get(U+"/metrics").text
tot=0
for i in range(3):
    r=post("/v1/chat/completions",{"messages":[{"role":"system","content":"You are a helpful assistant. "*20},{"role":"user","content":"hi"}],"max_tokens":2,"temperature":0},show=False).json(); tot+=r["usage"]["prompt_tokens"]
# aborted request
try: httpx.post(U+"/v1/completions",json={"prompt":"Write","max_tokens":500},timeout=1.5)
except Exception: pass
time.sleep(1)
after=c.get(U+"/metrics").text
for n in ["vllm:prompt_tokens_total","vllm:generation_tokens_total","vllm:request_success_total","vllm:e2e_request_latency_seconds_count","vllm:time_to_first_token_seconds_count"]:
    print(n, metric(n,before), "->", metric(n,after))
print("usage prompt tokens sum", tot)
