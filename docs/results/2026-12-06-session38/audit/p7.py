from h import *
C="/v1/completions"; CH="/v1/chat/completions"
r=post(C,{"prompt":"The capital of France is","max_tokens":3,"temperature":0,"logit_bias":{"7042":-100}},show=False).json(); print("bias -100 on Paris?", r["choices"][0]["text"])
exec(open('/tmp/audit/tok.py').read())
pid=tok(" Paris",add_special_tokens=False).input_ids; print("Paris ids",pid)
bid=tok(" London",add_special_tokens=False).input_ids; print("London ids",bid)
r=post(C,{"prompt":"The capital of France is","max_tokens":3,"temperature":0,"logit_bias":{str(pid[0]):-100}},show=False).json(); print("ban Paris:", repr(r["choices"][0]["text"]))
r=post(C,{"prompt":"The capital of France is","max_tokens":3,"temperature":0,"logit_bias":{str(bid[0]):100}},show=False).json(); print("force London:", repr(r["choices"][0]["text"]))
r=post(C,{"prompt":"The capital of France is","max_tokens":3,"temperature":0,"logit_bias":{str(bid[0]):100},"logprobs":1},show=False).json(); print("force London logprobs:", r["choices"][0]["logprobs"])
rep="one two one two one two one two"
for kw in [{}, {"frequency_penalty":2.0},{"presence_penalty":2.0},{"repetition_penalty":1.5},{"frequency_penalty":-2.0}]:
    r=post(C,dict({"prompt":rep,"max_tokens":12,"temperature":0},**kw),show=False).json(); print(kw, repr(r["choices"][0]["text"]))
r=post(C,{"prompt":"Hi","max_tokens":10,"temperature":0,"min_tokens":10,"stop_token_ids":[2]},show=False).json(); print("min_tokens", r["choices"][0], r["usage"])
r=post(C,{"prompt":"Hi","max_tokens":5,"temperature":0,"min_tokens":10},show=True)
r=post(C,{"prompt":"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n","max_tokens":30,"temperature":0},show=False).json(); print("special prompt", r["choices"][0], r["usage"])
r=post(C,{"prompt":"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n","max_tokens":30,"temperature":0,"ignore_eos":True,"skip_special_tokens":False},show=False).json(); print("ignore_eos", repr(r["choices"][0]["text"]), r["choices"][0]["finish_reason"], r["usage"])
