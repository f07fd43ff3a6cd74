from h import *
H={"Authorization":"Bearer secret"}; c.headers.update(H)
C="/v1/completions"
P="List: apple, banana, cherry, apple, banana, cherry, apple, banana, cherry, apple, banana,"
for stop in ["cherry, apple, banana, cherry", ", b"]:
  for sp in [0, {"num_speculative_tokens":4,"policy":"static"}]:
    for inc in [False, True]:
        body={"prompt":P,"max_tokens":40,"temperature":0,"stop":stop,"speculation":sp,"include_stop_str_in_output":inc,"logprobs":0}
        r=post(C,body,show=False).json(); ch=r["choices"][0]
        s,ev,raw=sse(C,dict(body,stream_options={"include_usage":True}),show=False)
        st="".join(e["choices"][0]["text"] for e in ev if e!="[DONE]" and e["choices"])
        ntok=len(ch["logprobs"]["tokens"])
        print(repr(stop),"spec",sp!=0,"inc",inc,"|",repr(ch["text"]),ch["finish_reason"],ch["stop_reason"],r["usage"]["completion_tokens"],"lp_tokens",ntok,"| stream same:",st==ch["text"],"stream usage",ev[-2]["usage"]["completion_tokens"])
