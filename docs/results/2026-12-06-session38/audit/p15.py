from h import *
H={"Authorization":"Bearer secret"}; c.headers.update(H)
C="/v1/completions"; CH="/v1/chat/completions"
M=[{"role":"user","content":"Name three colors."}]
tests=[
 (C,{"prompt":"Hi","max_tokens":5,"stop":""}),
 (C,{"prompt":"Hi","max_tokens":5,"stop":["", "x"]}),
 (C,{"prompt":"Hi","max_tokens":5,"top_k":100000,"temperature":1}),
 (C,{"prompt":"Hi","max_tokens":5,"repetition_penalty":100.0}),
 (C,{"prompt":"Hi","max_tokens":5,"logit_bias":{str(i):-100 for i in range(300)}}),
 (CH,{"messages":M,"max_tokens":20,"n":3,"temperature":1,"structured_outputs":{"choice":["red","green"]},"logprobs":True,"top_logprobs":20}),
 (CH,{"messages":M,"max_tokens":20,"temperature":0,"response_format":{"type":"json_object"},"logprobs":True,"stop":"}"}),
 (CH,{"messages":M,"max_tokens":20,"temperature":0,"structured_outputs":{"regex":"[a-z]+"},"min_tokens":5}),
 (CH,{"messages":M,"max_tokens":20,"temperature":0,"structured_outputs":{"choice":["red","green"]},"ignore_eos":True}),
 (CH,{"messages":M,"max_tokens":20,"temperature":0,"structured_outputs":{"choice":["red"],"json_object":True}}),
 (CH,{"messages":[{"role":"user","content":"hi","name":"bob"}],"max_tokens":3,"temperature":0}),
 (CH,{"messages":[{"role":"tool","content":"42","tool_call_id":"x"}],"max_tokens":3,"temperature":0}),
 (CH,{"messages":[{"role":"assistant","content":None}],"max_tokens":3,"temperature":0}),
 (CH,{"messages":M,"max_tokens":3,"temperature":0,"min_tokens":3,"stop_token_ids":[2],"ignore_eos":True}),
 (C,{"prompt":"Hi","max_tokens":5,"temperature":0,"logprobs":20,"n":2,"stream":False}),
 (C,{"prompt":"Hi","max_tokens":5,"temperature":0,"logprobs":21}),
 (CH,{"messages":M,"max_tokens":3,"temperature":0,"top_logprobs":21,"logprobs":True}),
 (CH,{"messages":M,"max_tokens":8100,"temperature":0}),
]
for path,b in tests:
    r=post(path,b,show=False)
    h=c.get(U+"/health").status_code
    print(r.status_code, json.dumps(b)[:160], "->", r.text[:260].replace("\n","\\n"), "| health", h)
