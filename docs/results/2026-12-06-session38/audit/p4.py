from h import *
C="/v1/completions"; CH="/v1/chat/completions"
M=[{"role":"user","content":"Give me a JSON object describing Paris with keys city and population."}]
def content(r): 
    j=r.json(); return (j["choices"][0].get("message",{}).get("content") if "message" in j.get("choices",[{}])[0] else j["choices"][0]["text"]) if r.status_code==200 else r.text
r=post(CH,{"messages":M,"max_tokens":60,"temperature":0,"response_format":{"type":"json_object"}},show=False); print("json_object:",r.status_code,repr(content(r)), r.json()["choices"][0]["finish_reason"] if r.status_code==200 else "")
schema={"type":"object","properties":{"city":{"type":"string"},"population":{"type":"integer"}},"required":["city","population"],"additionalProperties":False}
r=post(CH,{"messages":M,"max_tokens":60,"temperature":0,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":schema,"strict":True}}},show=False); print("json_schema:",r.status_code,repr(content(r)))
try: print(json.loads(content(r)))
except Exception as e: print("NOT JSON",e)
r=post(C,{"prompt":"Paris as JSON:","max_tokens":60,"temperature":0,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":schema}}},show=False); print("cmpl json_schema:",r.status_code,repr(content(r)))
r=post(CH,{"messages":M,"max_tokens":60,"temperature":0,"response_format":{"type":"json_schema","json_schema":{"name":"x"}}}); 
r=post(CH,{"messages":M,"max_tokens":60,"temperature":0,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"bogus"}}}}); 
r=post(CH,{"messages":[{"role":"user","content":"Is water wet?"}],"max_tokens":10,"temperature":0,"structured_outputs":{"choice":["yes","no"]}})
r=post(CH,{"messages":[{"role":"user","content":"Is water wet?"}],"max_tokens":10,"temperature":0,"guided_choice":["yes","no"]})
r=post(CH,{"messages":[{"role":"user","content":"phone?"}],"max_tokens":20,"temperature":0,"guided_regex":"\\d{3}-\\d{4}"})
r=post(CH,{"messages":[{"role":"user","content":"color?"}],"max_tokens":20,"temperature":0,"guided_grammar":'root ::= "red" | "blue"'})
r=post(CH,{"messages":[{"role":"user","content":"color?"}],"max_tokens":20,"temperature":0,"guided_regex":"("})
# structured + stream
s,ev,raw=sse(CH,{"messages":M,"max_tokens":60,"temperature":0,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":schema}}},show=False)
print("stream json_schema:", repr("".join(e["choices"][0]["delta"].get("content","") for e in ev if e!="[DONE]" and e["choices"])))
# json_object with small max_tokens -> truncated
r=post(CH,{"messages":M,"max_tokens":5,"temperature":0,"response_format":{"type":"json_object"}},show=True)
