"""Which tokens to draft for the text a grammar forces: replayed over greedy replies.

The first 16 json items are answered greedily under their schemas (no drafts). Each reply is then
replayed through a fresh matcher as a jump-forward engine would see it: at each step the forced
text is turned into drafts by one rule, the drafts are accepted while they equal the reply, and
the step advances past the accepted drafts and the model's own next token.

- xgrammar:  the matcher's find_jump_forward_tokens() (longest match, drops a last token that
             a longer vocabulary token extends)
- tokenizer: the model tokenizer's encoding of find_jump_forward_string()
- drop-last: the same without the run's last token

    python docs/results/2026-12-04-session24/forced_tokenization.py [compact|any]
"""

import sys

from specserve import LLM, SamplingParams, StructuredOutputsParams
from specserve.bench.workloads import json_schema, load_workload

compact = (sys.argv[1] if len(sys.argv) > 1 else "compact") == "compact"
llm = LLM(jump_forward_tokens=0)
tok = llm.get_tokenizer()
items = load_workload("json")[:16]
specs = [StructuredOutputsParams(json=json_schema(i), disable_any_whitespace=compact)
         for i in items]
outs = llm.chat([i.messages for i in items],
                [SamplingParams(temperature=0, max_tokens=128, structured_outputs=s)
                 for s in specs])
replies = [o.outputs[0].token_ids for o in outs]
backend = llm.engine._grammar


def encode(m) -> list[int]:
    text = m.find_jump_forward_string()
    return tok.encode(text, add_special_tokens=False) if text else []


RULES = {"xgrammar": lambda m: m.find_jump_forward_tokens(),
         "tokenizer": encode,
         "drop-last": lambda m: encode(m)[:-1]}
print(f"{'compact' if compact else 'any'} whitespace, {len(items)} json items, greedy")
for name, rule in RULES.items():
    tokens = steps = drafted = accepted = 0
    for spec, ids in zip(specs, replies, strict=True):
        m = backend.matcher(spec, set())
        i = 0
        while i < len(ids):
            drafts = rule(m)[:8] if i else []  # the first token follows the prompt: no drafts
            n = 0
            while n < len(drafts) and i + n < len(ids) and ids[i + n] == drafts[n]:
                n += 1
            drafted, accepted, steps = drafted + len(drafts), accepted + n, steps + 1
            for t in ids[i:i + n + 1]:
                if not m.is_terminated():
                    m.accept_token(t)
            i += n + 1
        tokens += len(ids)
    print(f"{name:10s} {tokens / steps:.2f} tokens per step  drafted {drafted:4d}  "
          f"accepted {accepted:4d} ({accepted / max(drafted, 1):.0%})")
