"""Jump-forward drafts: the tokens a structured-output grammar forces are verified as drafts. The
output must be exactly what constrained decoding without drafts gives (greedy), distributed as
it is (sampled), and nothing is drafted where speculation is turned off."""

from __future__ import annotations

import json
from collections import Counter

import torch
from test_rejection_sampler import ALPHA, chi2_sf

from specserve import LLM, SamplingParams, StructuredOutputsParams
from specserve.bench.workloads import json_schema, load_workload
from specserve.engine.request import Request
from specserve.sample.grammar import GrammarBackend


def _schema_params(item, **kw) -> SamplingParams:
    so = StructuredOutputsParams(json=json_schema(item), disable_any_whitespace=True)
    return SamplingParams(**{"temperature": 0, "max_tokens": 48, "structured_outputs": so, **kw})


def _jump_forward(llm: LLM) -> tuple[int, int]:
    s = llm.get_stats()
    return s["num_jump_forward_tokens"], s["num_jump_forward_accepted"]


def test_forced_runs_are_drafted_in_the_models_tokenization_and_doubtful_tails_held_back(llm):
    """The forced text is encoded as the model's tokenizer writes it. Its last token is
    drafted while the model writes that token at the end of runs at least half the time, held
    back otherwise, and observed either way; a grammar that forces nothing drafts nothing."""
    engine, tok = llm.engine, llm.get_tokenizer()
    backend = GrammarBackend(tok, engine.model_config.vocab_size,
                             engine.model_config.eos_token_ids)  # fresh tail statistics
    spec = StructuredOutputsParams(grammar='root ::= "The answer is " ("yes" | "no")')
    req = Request("jf-unit", [1], SamplingParams(structured_outputs=spec))
    req.grammar = backend.matcher(spec, set())
    run = tok.encode("The answer is ", add_special_tokens=False)
    other = tok.encode(" yes", add_special_tokens=False)[0]
    assert len(run) > 2 and other != run[-1]
    # Cut by the limit, the run goes on: its last draft is not the run's tail.
    assert backend.forced_tokens(req, 2) == run[:2] and req.jump_forward_tail is None
    assert backend.forced_tokens(req, 16) == run
    assert req.jump_forward_tail == (run[-1], len(run) - 1)

    def step(emitted: list[int]) -> None:
        backend.forced_tokens(req, 16)
        backend.observe_tail(req, emitted)

    step(run[:-1] + [other])  # the model wrote something else there: 0 of 1
    assert backend.forced_tokens(req, 16) == run[:-1]  # held back
    step(run[:2])  # a step that stopped short of the tail observes nothing
    assert backend.forced_tokens(req, 16) == run[:-1]
    step(run)  # held back, and the model wrote it there (the bonus token): 1 of 2
    assert backend.forced_tokens(req, 16) == run

    class SpacePrefixing:  # as SentencePiece (Llama 2) encodes: a space before the first word
        def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
            return tok.encode(" " + text, add_special_tokens=add_special_tokens)

    backend._tokenizer = SpacePrefixing()
    backend._encode.cache_clear()
    # Its tokens would spell " The answer is ": xgrammar's own tokens are drafted instead.
    assert backend.forced_tokens(req, 16) == req.grammar.find_jump_forward_tokens() != []
    for token in run:
        assert req.grammar.accept_token(token)
    assert backend.forced_tokens(req, 16) == []  # yes or no: the model decides


def test_a_long_forced_string_is_encoded_by_its_head(llm):
    """A schema's 20k-character const: the drafts are the first tokens of the whole string, but
    only its head is encoded (and cached) at each step, not 20k characters a step."""
    engine, tok = llm.engine, llm.get_tokenizer()
    backend = GrammarBackend(tok, engine.model_config.vocab_size,
                             engine.model_config.eos_token_ids)
    words = " ".join(f"word{i} is here." for i in range(1500))
    spec = StructuredOutputsParams(json={"type": "string", "const": words})
    req = Request("jf-long", [1], SamplingParams(structured_outputs=spec))
    req.grammar = backend.matcher(spec, set())
    text = req.grammar.find_jump_forward_string()
    assert len(text) > 20_000
    whole = tok.encode(text, add_special_tokens=False)
    encoded, encode = [], backend._encode
    backend._encode = lambda t: (encoded.append(len(t)), encode(t))[1]
    assert backend.forced_tokens(req, 8) == whole[:8] and req.jump_forward_tail is None
    assert backend.forced_tokens(req, 1) == whole[:1]  # one draft: a head of 3 x 32 characters
    assert encoded and max(encoded) <= (8 + 2) * 32


def test_greedy_jump_forward_is_lossless_in_a_mixed_batch(llm):
    """json workload items under their schemas, beside a free request, with jump-forward drafts
    (the default) and without them (speculation off for the request): identical tokens, most
    forced drafts accepted, and the proposer's draft counters untouched."""
    items = load_workload("json")[:6]
    convs = [item.messages for item in items] + [[{"role": "user", "content": "Hi there!"}]]
    free = SamplingParams(temperature=0, max_tokens=24)
    without = llm.chat(convs, [_schema_params(i, speculation_policy="off") for i in items]
                       + [free])
    before = _jump_forward(llm)
    with_jf = llm.chat(convs, [_schema_params(i) for i in items] + [free])
    drafted, accepted = (a - b for a, b in zip(_jump_forward(llm), before, strict=True))
    assert [o.outputs[0].token_ids for o in with_jf] == [o.outputs[0].token_ids for o in without]
    assert drafted > 0 and accepted > drafted // 2, (drafted, accepted)
    assert all(o.metrics.num_draft_tokens == 0 for o in with_jf)  # counted apart
    for out in with_jf[:-1]:
        if out.outputs[0].finish_reason == "stop":  # a cut-off object is not valid JSON
            json.loads(out.outputs[0].text)
    stats = llm.get_stats()
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_jump_forward_survives_a_small_token_budget_and_preemption(llm):
    """A token budget that cuts drafts short and a KV pool that forces preemption while drafts
    are pending: the same tokens, and every block free afterwards."""
    items = load_workload("json")[:4]
    convs = [item.messages for item in items]
    reference = llm.chat(convs, [_schema_params(i, speculation_policy="off") for i in items])
    bs = 16
    needed = sum(-(-(len(o.prompt_token_ids) + 48) // bs) for o in reference)
    small = LLM(dtype="float32", num_blocks=needed // 2, block_size=bs,
                max_num_batched_tokens=24)
    outs = small.chat(convs, [_schema_params(i) for i in items])
    assert [o.outputs[0].token_ids for o in outs] == \
        [o.outputs[0].token_ids for o in reference]
    stats = small.get_stats()
    assert stats["num_jump_forward_accepted"] > 0 and stats["num_preemptions"] > 0
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


def test_nothing_is_drafted_where_speculation_is_off(llm):
    """Per request (policy off, K = 0), for a seeded sampled request (the number of draws from
    its generator would depend on the batch), and engine-wide."""
    item = load_workload("json")[0]
    before = _jump_forward(llm)
    llm.chat([item.messages], _schema_params(item, speculation_policy="off", max_tokens=12))
    llm.chat([item.messages], _schema_params(item, num_speculative_tokens=0, max_tokens=12))
    llm.chat([item.messages], _schema_params(item, temperature=0.8, seed=3, max_tokens=12))
    assert _jump_forward(llm) == before
    llm.chat([item.messages], _schema_params(item, temperature=0.8, max_tokens=12))  # drafts
    assert _jump_forward(llm)[0] > before[0]
    off = LLM(dtype="float32", speculation_policy="off", kv_cache_memory=64 << 20)
    off.chat([item.messages], _schema_params(item, max_tokens=12))
    assert _jump_forward(off) == (0, 0)


def test_sampled_jump_forward_keeps_the_constrained_distribution(llm):
    """Sampling at temperature 1 under a grammar that forces a phrase the model may tokenize
    in more than one way: the distribution of whole replies (token ids) with jump-forward
    drafts is that of constrained sampling without them (a two-sample chi-square test of
    homogeneity at ALPHA). Unseeded requests (seeded ones draft nothing), from a fixed global
    seed."""
    spec = StructuredOutputsParams(
        grammar='root ::= " The colour is " ("red" | "green" | "blue" | "a shade of grey")')
    n = 240
    prompt = "Q: What colour is the sea on a stormy day?\nA:"

    def replies(**kw) -> Counter:
        params = SamplingParams(temperature=1.0, max_tokens=16, structured_outputs=spec, **kw)
        return Counter(tuple(o.outputs[0].token_ids) for o in llm.generate([prompt] * n, params))

    torch.manual_seed(0)
    before = _jump_forward(llm)
    drafted = replies()
    assert _jump_forward(llm)[0] > before[0]  # the forced phrase was drafted
    plain = replies(speculation_policy="off")
    # The test's power: without drafts some reply text comes in two tokenizations at least 10
    # times each, so drafts accepted unconditionally (every reply in the tokenizer's own
    # encoding of the forced phrase) would empty a category the table tests.
    tokenizations: dict[str, list[int]] = {}
    for ids, count in plain.items():
        tokenizations.setdefault(llm.get_tokenizer().decode(ids), []).append(count)
    assert any(sum(c >= 10 for c in counts) >= 2 for counts in tokenizations.values()), \
        tokenizations
    # Categories with enough samples to test; the rest pooled.
    keys = [k for k in drafted.keys() | plain.keys() if drafted[k] + plain[k] >= 10]
    table = [(drafted[k], plain[k]) for k in keys]
    table.append((n - sum(a for a, _ in table), n - sum(b for _, b in table)))
    table = [row for row in table if sum(row) > 0]
    assert len(table) >= 3, "the test needs replies the model really chooses between"
    statistic = sum((obs - sum(row) / 2) ** 2 / (sum(row) / 2) for row in table for obs in row)
    p = chi2_sf(statistic, len(table) - 1)
    assert p > ALPHA, (p, table)
