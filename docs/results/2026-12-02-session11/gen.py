import pickle, sys, time
from specserve.llm import LLM
from specserve.train.data import DataConfig, build_data, workload_prompts
replies, temp, out = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
items = workload_prompts("prose,json,sql,rag")
llm = LLM(seed=0)
t = time.perf_counter()
data = build_data(llm, items, DataConfig(replies_per_prompt=replies, reply_temperature=temp), seed=0)
print(len(data.train), len(data.held_out), sum(s.reply_len for s in data.train), time.perf_counter() - t, flush=True)
pickle.dump(data, open(out, "wb"))
