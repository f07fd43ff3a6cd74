import json, httpx, sys, time
U = "http://127.0.0.1:8765"
c = httpx.Client(timeout=120)
def post(path, body, show=True, headers=None):
    r = c.post(U+path, json=body, headers=headers)
    if show:
        print(">>", path, json.dumps(body)[:300])
        print("<<", r.status_code, r.text[:1500])
    return r
def sse(path, body, show=True):
    body = dict(body, stream=True)
    events = []
    with c.stream("POST", U+path, json=body) as r:
        raw = r.read().decode()
    if show: print(">>", path, json.dumps(body)[:300]); print("<< status", r.status_code)
    for block in raw.split("\n\n"):
        if not block.strip(): continue
        assert block.startswith("data: "), repr(block)
        d = block[6:]
        events.append(d if d == "[DONE]" else json.loads(d))
    return r.status_code, events, raw
