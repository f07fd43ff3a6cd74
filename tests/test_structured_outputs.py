"""Structured outputs (xgrammar) in the engine: every constraint kind holds on the real model, a
constraint does not leak into the other requests of a batch, speculative verification under a
grammar stays lossless, and bad specs are refused before anything is queued."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest
import torch

from specserve import LLM, SamplingParams, StructuredOutputsParams
from specserve.bench.workloads import json_schema, load_workload
from specserve.engine.request import Request

CITY = {"type": "object", "additionalProperties": False,
        "properties": {"city": {"type": "string", "maxLength": 24},
                       "population": {"type": "integer"}, "capital": {"type": "boolean"}},
        "required": ["city", "population", "capital"]}
COPY_CITY = ('Copy this record: {"city": "Paris", "population": 2100000, "capital": true}\n'
             "Now the record for Lyon:")
PHONE = r"\(\d{3}\) \d{3}-\d{4}"
CHOICES = ["yes", "no", "maybe so"]

# (prompt, constraint, check of the text)
CASES = [
    (COPY_CITY, StructuredOutputsParams(json=CITY),
     lambda t: set(json.loads(t)) == set(CITY["required"])
     and isinstance(json.loads(t)["population"], int)),
    ("Return a JSON object with the keys name and age for Ann, 31.",
     StructuredOutputsParams(json_object=True), lambda t: isinstance(json.loads(t), dict)),
    ("The office phone number is", StructuredOutputsParams(regex=PHONE),
     lambda t: re.fullmatch(PHONE, t) is not None),
    ("Is the sky green? Answer:", StructuredOutputsParams(choice=CHOICES),
     lambda t: t in CHOICES),
    ("My favourite colour is", StructuredOutputsParams(grammar='root ::= "red" | "blue"'),
     lambda t: t in ("red", "blue")),
]


def _params(spec: StructuredOutputsParams | None, **kw) -> SamplingParams:
    return SamplingParams(**{"temperature": 0, "max_tokens": 64, "structured_outputs": spec,
                             **kw})


@pytest.fixture(scope="module")
def constrained(llm) -> list:
    """Constrained decoding without drafts of any kind: the reference of the lossless tests
    (the other requests draft what their grammar forces, as the engine does by default)."""
    return [o.outputs[0] for o in llm.generate(
        [p for p, _, _ in CASES], [_params(s, speculation_policy="off") for _, s, _ in CASES])]


@pytest.mark.parametrize("i", range(len(CASES)), ids=[s.kind for _, s, _ in CASES])
def test_output_obeys_its_constraint(constrained, i: int):
    out = constrained[i]
    assert out.finish_reason == "stop", out.text  # the grammar completed, then EOS
    assert CASES[i][2](out.text), out.text


def test_unconstrained_reply_differs(llm, constrained):
    """The checks above are not satisfied by the model's free reply anyway."""
    free = llm.generate([CASES[2][0]], _params(None))[0].outputs[0].text
    assert re.fullmatch(PHONE, free) is None and free != constrained[2].text


def test_constraints_do_not_leak_across_a_batch(llm, constrained):
    """Constrained and free requests in one batch: each gets what it gets alone."""
    free_prompts = ["The capital of France is", "def fibonacci(n):\n    "]
    alone = [o.outputs[0].token_ids for o in llm.generate(free_prompts, _params(None))]
    # Interleaved, so that the constrained rows are not one block of the logits.
    order = [0, "f0", 1, 2, "f1", 3, 4]
    prompts = [free_prompts[int(i[1])] if isinstance(i, str) else CASES[i][0] for i in order]
    params = [_params(None) if isinstance(i, str) else _params(CASES[i][1]) for i in order]
    outs = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert outs == [alone[int(i[1])] if isinstance(i, str) else constrained[i].token_ids
                    for i in order]


SPEC_CONFIGS = {
    "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3},
    "suffix": {"method": "suffix", "num_speculative_tokens": 4},
    "self-draft": {"method": "draft", "num_speculative_tokens": 3, "draft_layers": 2},
}


@pytest.fixture(scope="module")
def spec_llms() -> dict[str, LLM]:
    # static: every step verifies drafts, whatever the controller would judge them worth.
    # The budget covers the self-draft's fp32 weights (243 MiB) and a small pool. No
    # jump-forward drafts: every draft is the proposer's (tests/test_jump_forward.py has those).
    return {name: LLM(dtype="float32", speculative_config=config, speculation_policy="static",
                      kv_cache_memory=512 << 20, jump_forward_tokens=0)
            for name, config in SPEC_CONFIGS.items()}


@pytest.mark.parametrize("name", list(SPEC_CONFIGS))
def test_speculation_under_a_grammar_is_lossless(spec_llms, constrained, name):
    """Every draft is verified against the masked distribution: greedy output equals
    constrained decoding without speculation, and drafts were really verified."""
    spec = spec_llms[name]
    before = spec.get_stats()
    outs = spec.generate([p for p, _, _ in CASES], [_params(s) for _, s, _ in CASES])
    assert [o.outputs[0].token_ids for o in outs] == [c.token_ids for c in constrained]
    stats = spec.get_stats()
    assert stats["num_draft_tokens"] > before["num_draft_tokens"]
    if name == "ngram":  # the record to copy is in the prompt
        assert stats["num_accepted_tokens"] > before["num_accepted_tokens"]
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


@pytest.mark.parametrize("name", list(SPEC_CONFIGS))
def test_jump_forward_beside_a_proposer_is_lossless(llm, spec_llms, name):
    """Forced drafts and the proposer's in one engine (a stateful draft model catches up over
    the forced tokens it never proposed): greedy output equals constrained decoding without
    drafts, and both kinds of drafts were verified."""
    items = load_workload("json")[:3]
    params = [SamplingParams(temperature=0, max_tokens=40, structured_outputs=(
        StructuredOutputsParams(json=json_schema(i), disable_any_whitespace=True)))
        for i in items]
    convs = [i.messages for i in items]
    reference = llm.chat(convs, [dataclasses.replace(p, speculation_policy="off") for p in params])
    spec = spec_llms[name]
    before = spec.get_stats()
    spec.engine.jump_forward_tokens = 8
    try:
        outs = spec.chat(convs, params)
    finally:
        spec.engine.jump_forward_tokens = 0
    assert [o.outputs[0].token_ids for o in outs] == [o.outputs[0].token_ids for o in reference]
    stats = spec.get_stats()
    assert stats["num_jump_forward_accepted"] > before["num_jump_forward_accepted"]
    assert stats["num_draft_tokens"] > before["num_draft_tokens"]
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]


@pytest.mark.parametrize("name", list(SPEC_CONFIGS))
def test_sampled_outputs_obey_the_grammar_under_speculation(spec_llms, name):
    """Sampled requests verify drafts under the mask (unseeded: a seeded sampled request drafts
    nothing, Request.drafts_nothing), and every reply still matches the regex. The prompt holds
    a number for n-gram to copy from."""
    spec = spec_llms[name]
    before = spec.get_stats()
    torch.manual_seed(0)
    params = SamplingParams(temperature=1.0, max_tokens=24,
                            structured_outputs=StructuredOutputsParams(regex=PHONE))
    outs = spec.generate(["Call us at (555) 123-4567, or at"] * 8, params)
    assert all(re.fullmatch(PHONE, o.outputs[0].text) for o in outs)
    assert len({o.outputs[0].text for o in outs}) > 1  # really sampled
    stats = spec.get_stats()
    drafted = stats["num_draft_tokens"] - before["num_draft_tokens"]
    accepted = stats["num_accepted_tokens"] - before["num_accepted_tokens"]
    assert drafted > 0 and accepted < drafted  # verified, and some drafts were rejected


def _masked_rows(llm, drafts: list[str], grammar: str = 'root ::= "ab" "cd"'):
    """The allowed token ids of each row of one request verifying `drafts` under `grammar`,
    and its matcher's first-row mask afterwards (to show it was rolled back)."""
    engine, tok = llm.engine, llm.get_tokenizer()
    spec = StructuredOutputsParams(grammar=grammar)
    backend = engine._grammar_backend()
    req = Request("mask-test", [1, 2, 3], SamplingParams(structured_outputs=spec))
    req.grammar = backend.matcher(spec, set())
    req.spec_token_ids = [t if isinstance(t, int) else tok.convert_tokens_to_ids(t)
                          for t in drafts]
    vocab = engine.model_config.vocab_size
    logits = torch.zeros(len(drafts) + 1, vocab)
    backend.mask(logits, [(req, len(drafts))])
    req.spec_token_ids = []
    again = torch.zeros(1, vocab)
    backend.mask(again, [(req, 0)])
    allowed = [set(torch.isfinite(row).nonzero().flatten().tolist()) for row in logits]
    return allowed, set(torch.isfinite(again[0]).nonzero().flatten().tolist())


def test_verification_rows_are_masked_for_the_state_after_each_draft(llm):
    """Row j of a request verifying K drafts allows what the grammar allows after drafts
    0..j-1; the matcher is left where it was."""
    tok = llm.get_tokenizer()
    ab, cd = tok.convert_tokens_to_ids("ab"), tok.convert_tokens_to_ids("cd")
    eos = set(llm.engine.model_config.eos_token_ids)
    allowed, after = _masked_rows(llm, ["ab", "cd"])
    assert ab in allowed[0] and cd not in allowed[0]
    assert cd in allowed[1] and ab not in allowed[1]
    assert allowed[2] == eos  # complete: only EOS
    assert after == allowed[0]  # rolled back
    # A forbidden draft: its own row forbids it (so it is rejected); the rows after it are
    # left unmasked, since they are never read.
    allowed, after = _masked_rows(llm, ["cd", "ab"])
    assert cd not in allowed[0] and len(allowed[1]) == len(allowed[2]) == tok_vocab(llm)
    assert after == allowed[0]
    # A draft that ends the output (EOS after a completed grammar): nothing after it is masked.
    allowed, after = _masked_rows(llm, ["ab", "cd", min(eos), "ab"])
    assert allowed[2] == eos and len(allowed[3]) == len(allowed[4]) == tok_vocab(llm)
    assert after == allowed[0]


def tok_vocab(llm) -> int:
    return llm.engine.model_config.vocab_size


def test_a_grammar_after_the_reasoning_masks_only_the_rows_after_its_end(llm):
    """starts_after: rows up to the draft that ends the reasoning are free, the rows after it
    are masked from the grammar's start; the emitted reasoning, in two steps that split the
    end's bytes, leaves the matcher at its start, then the answer advances it."""
    engine, tok = llm.engine, llm.get_tokenizer()
    backend = engine._grammar_backend()
    spec = StructuredOutputsParams(grammar='root ::= "ab" "cd"', starts_after="</think>")
    req = Request("after-test", [1, 2, 3], SamplingParams(structured_outputs=spec))
    req.grammar, req.grammar_after = backend.matcher(spec, set()), b"</think>"
    think = tok.encode(" ok.</think>", add_special_tokens=False)
    ab, cd = tok.convert_tokens_to_ids("ab"), tok.convert_tokens_to_ids("cd")
    req.spec_token_ids = think + [ab, cd]
    vocab = engine.model_config.vocab_size
    logits = torch.zeros(len(req.spec_token_ids) + 1, vocab)
    backend.mask(logits, [(req, len(req.spec_token_ids))])
    allowed = [set(torch.isfinite(row).nonzero().flatten().tolist()) for row in logits]
    n = len(think)
    assert all(len(a) == vocab for a in allowed[:n])  # still reasoning: free
    assert ab in allowed[n] and cd not in allowed[n]  # the answer starts under the grammar
    assert cd in allowed[n + 1] and ab not in allowed[n + 1]
    # Emitted in steps that split the end's bytes, one token at a time and after "</"
    # (" ok.</" then "think>"); then the answer's first token.
    split = tok.convert_tokens_to_ids(["</", "th", "ink", ">"])  # another split of the end
    for tokens, cuts in ((think, [1, 2, 3, 4]), (think, [think.index(split[0]) + 1]),
                         (split, [2])):
        req.grammar, req.grammar_after, req.grammar_tail = (backend.matcher(spec, set()),
                                                            b"</think>", b"")
        for a, b in zip([0, *cuts], [*cuts, len(tokens)], strict=True):
            assert req.grammar_after is not None
            backend.accept_emitted(req, tokens[a:b])
        assert req.grammar_after is None, (tokens, cuts)
    backend.accept_emitted(req, [ab])
    req.spec_token_ids = []
    after = torch.zeros(1, vocab)
    backend.mask(after, [(req, 0)])
    allowed = set(torch.isfinite(after[0]).nonzero().flatten().tolist())
    assert cd in allowed and ab not in allowed and len(allowed) < 4  # "cd" (or "c", then "d")


# SmolLM2 does not reason; continuing this assistant message it writes " c.</think>Done...", as a
# reasoning model closes its reasoning.
REASONING = [{"role": "user", "content": "Think, then answer."},
             {"role": "assistant", "content": "Think: a b c.</think>Done.\nThink: a b c.</think>"
                                              "Done.\nThink: a b"}]


OK = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
      "additionalProperties": False}
AFTER_REASONING = [dataclasses.replace(StructuredOutputsParams(choice=["YES"]),
                                       starts_after="</think>"),
                   StructuredOutputsParams(json=OK, disable_any_whitespace=True,
                                           starts_after="</think>")]


@pytest.fixture(scope="module")
def after_reasoning(llm) -> list[str]:
    """The replies without speculation: the reasoning free, then the constrained answer."""
    return [llm.chat(REASONING, _params(spec, max_tokens=24, speculation_policy="off"),
                     add_generation_prompt=False, continue_final_message=True)[0].outputs[0].text
            for spec in AFTER_REASONING]


def test_the_answer_after_the_reasoning_is_constrained(after_reasoning):
    (yes, ok) = [text.partition("</think>") for text in after_reasoning]
    assert yes == (" c.", "</think>", "YES")  # free, the model wrote "Done."
    assert ok[0] == " c." and isinstance(json.loads(ok[2])["ok"], bool)


@pytest.mark.parametrize("name", list(SPEC_CONFIGS))
def test_speculation_around_the_end_of_reasoning_is_lossless(spec_llms, after_reasoning, name):
    """Drafts across the end of the reasoning: the rows before it free, those after masked."""
    got = [spec_llms[name].chat(REASONING, _params(spec, max_tokens=24),
                                add_generation_prompt=False,
                                continue_final_message=True)[0].outputs[0].text
           for spec in AFTER_REASONING]
    assert got == after_reasoning


def test_a_completed_grammar_ends_the_output_despite_min_tokens(llm):
    """min_tokens masks stop tokens, but a completed grammar allows nothing else: the grammar
    wins, the output ends at its EOS (not with a token from an all -inf row)."""
    params = SamplingParams(temperature=0, max_tokens=20, min_tokens=10,
                            structured_outputs=StructuredOutputsParams(choice=CHOICES))
    out = llm.generate([CASES[3][0]], params)[0].outputs[0]
    assert out.text in CHOICES and out.finish_reason == "stop"
    assert out.token_ids[-1] in llm.engine.model_config.eos_token_ids
    assert len(out.token_ids) < 10


def test_json_object_means_an_object_not_an_array(llm):
    """OpenAI's json_object is an object; xgrammar's built-in JSON grammar also admits arrays."""
    backend = llm.engine._grammar_backend()
    req = Request("object-test", [1], SamplingParams())
    req.grammar = backend.matcher(StructuredOutputsParams(json_object=True), set())
    logits = torch.zeros(1, llm.engine.model_config.vocab_size)
    backend.mask(logits, [(req, 0)])
    tok = llm.get_tokenizer()
    assert torch.isfinite(logits[0, tok.convert_tokens_to_ids("{")])
    assert not torch.isfinite(logits[0, tok.convert_tokens_to_ids("[")])


def test_top_logprobs_under_a_grammar_are_finite(llm):
    """Two choices allow fewer tokens than the 10 top logprobs asked for: no -inf entries."""
    params = SamplingParams(temperature=0, max_tokens=8, logprobs=10,
                            structured_outputs=StructuredOutputsParams(choice=["yes", "no"]))
    out = llm.generate([CASES[3][0]], params)[0].outputs[0]
    assert all(math.isfinite(v) for entry in out.logprobs for v in entry.values())
    assert len(out.logprobs[0]) < 10


@pytest.mark.parametrize("kwargs, message", [
    ({}, "exactly one"),
    ({"regex": "a+", "choice": ["a"]}, "exactly one"),
    ({"json": "{not json"}, "not valid JSON"),
    ({"json": 5}, "JSON schema"),
    ({"choice": []}, "non-empty list"),
    ({"choice": ["a", ""]}, "non-empty list"),
    ({"regex": ""}, "non-empty string"),
    ({"json": "[" * 100_000}, "not valid JSON"),  # nested too deep: RecursionError inside
])
def test_bad_structured_outputs_params(kwargs, message):
    with pytest.raises(ValueError, match=message):
        StructuredOutputsParams(**kwargs)


@pytest.mark.parametrize("spec", [
    StructuredOutputsParams(regex="(unclosed"),
    StructuredOutputsParams(grammar="root ::= undefined_rule"),
    StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": 12}}}),
], ids=["regex", "grammar", "schema"])
def test_a_spec_that_does_not_compile_is_refused_and_nothing_is_queued(llm, spec):
    before = llm.get_stats()["kv_blocks_free"]
    with pytest.raises(ValueError, match="does not compile") as refused:
        llm.generate(["Hello"], _params(spec))
    assert ".cc:" not in str(refused.value)  # no C++ source locations for the user
    assert not llm.engine.has_unfinished_requests()
    assert llm.get_stats()["kv_blocks_free"] == before
    assert llm.generate(["Hello"], _params(None))[0].outputs[0].token_ids  # still serving


def test_cli_generate_takes_structured_outputs(capsys):
    from specserve.cli import main

    main(["generate", "--dtype", "float32", "--kv-cache-memory", "64MiB", "--prompt",
          CASES[3][0], "--max-tokens", "8", "--structured-outputs",
          json.dumps({"choice": CHOICES})])
    reply = capsys.readouterr().out.splitlines()[1]
    assert reply in CHOICES
    with pytest.raises(SystemExit, match="regexp"):
        main(["generate", "--prompt", "x", "--structured-outputs", '{"regexp": "a"}'])


def test_a_grammar_compiled_off_the_engine_thread_is_not_compiled_again(llm, monkeypatch):
    """The server compiles a request's grammar on a worker thread and hands it over: the engine
    thread must not compile it again (the compiler's cache may have evicted it meanwhile, and a
    large schema would stall every stream)."""
    params = SamplingParams(temperature=0, max_tokens=4, structured_outputs=(
        StructuredOutputsParams(choice=["yes", "no", "maybe"])))
    compiled = llm.engine.compile_grammar(params)
    monkeypatch.setattr(llm.engine._grammar_backend(), "compile",
                        lambda spec: pytest.fail("compiled on the engine thread"))
    req = llm.engine.add_request("Is water wet? Answer:", params, compiled_grammar=compiled)
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    assert llm.engine.tokenizer.decode(req.output_token_ids,
                                       skip_special_tokens=True) in ("yes", "no", "maybe")
