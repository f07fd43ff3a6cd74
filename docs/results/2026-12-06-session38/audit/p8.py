from openai import OpenAI
import openai
client = OpenAI(base_url="http://127.0.0.1:8765/v1", api_key="unused")
stream = client.chat.completions.create(
    model="SmolLM2-135M-Instruct", stream=True, max_tokens=64,
    messages=[{"role": "user", "content": "Explain speculative decoding in two sentences."}],
    extra_body={"speculation": {"num_speculative_tokens": 0}},
)
for chunk in stream:
    print(chunk.choices[0].delta.content or "", end="", flush=True)
print()
print(client.models.list())
r=client.completions.create(model="SmolLM2-135M-Instruct", prompt=["a","b"], max_tokens=2, temperature=0)
print(r)
r=client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=[{"role":"user","content":"hi"}], max_completion_tokens=3, n=2, logprobs=True, top_logprobs=2)
print(r.choices[0].logprobs.content[0])
s=client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=[{"role":"user","content":"hi"}], max_tokens=3, stream=True, stream_options={"include_usage":True})
for ch in s: print(ch.choices, ch.usage)
s=client.completions.create(model="SmolLM2-135M-Instruct", prompt="hi", max_tokens=3, stream=True, stream_options={"include_usage":True})
for ch in s: print(ch.choices, ch.usage)
try:
    client.chat.completions.create(model="nope", messages=[{"role":"user","content":"hi"}], max_tokens=3)
except openai.NotFoundError as e: print("NotFound ok", e)
from pydantic import BaseModel
class City(BaseModel):
    city: str
    population: int
try:
    r=client.beta.chat.completions.parse(model="SmolLM2-135M-Instruct", messages=[{"role":"user","content":"Paris JSON"}], max_tokens=60, temperature=0, response_format=City)
    print("parse", r.choices[0].message.parsed)
except Exception as e: print("parse fail", type(e), e)
