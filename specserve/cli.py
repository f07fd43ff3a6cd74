"""The `specserve` command line. It only parses flags into configs and calls the library."""

from __future__ import annotations

import argparse
import json
import os
import sys

from specserve.config import parse_memory_size
from specserve.server.cli import add_serve_parser
from specserve.train.cli import add_train_parser


def parse_memory(value: str) -> int | float:
    """config.parse_memory_size for argparse."""
    try:
        return parse_memory_size(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None,
                   help="a local Hugging Face directory or .gguf file (default: the embedded "
                        "SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="auto",
                   help="auto (bf16 wherever it beats fp32 on this hardware, else fp32) | "
                        "bfloat16 | float32 | float16 (GPUs without bf16)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (weights and KV pools)")
    p.add_argument("--quantization", default=None, help="int8 | int4 | gguf | fp8")
    p.add_argument("--kv-cache-memory", type=parse_memory, default=1 << 30,
                   help="KV pool size: bytes ('1GiB') or a fraction of free memory (default 1GiB)")
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-num-seqs", type=int, default=128)
    p.add_argument("--scheduling-policy", choices=("fcfs", "priority"), default="fcfs",
                   help="fcfs: arrival order | priority: each request's priority (lower first, "
                        "then arrival), which also picks whom to preempt (vLLM's)")
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--enable-lora", action="store_true",
                   help="let requests run LoRA adapters (PEFT directories) on the base model")
    p.add_argument("--max-lora-rank", type=int, default=16,
                   help="the largest adapter rank accepted (default 16, as vLLM)")
    p.add_argument("--max-loras", type=int, default=None,
                   help="distinct adapters the running requests may use at once; a request "
                        "whose adapter would exceed it waits (default: no limit)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-threads", type=int, default=None)
    p.add_argument("--speculative-config", type=json.loads, default=None,
                   help='JSON, e.g. \'{"method": "ngram", "num_speculative_tokens": 4}\'')
    p.add_argument("--speculation-policy", default="adaptive",
                   help="off | static | batch-threshold:N | schedule:B=K,... | adaptive")
    p.add_argument("--jump-forward-tokens", type=int, default=8,
                   help="most tokens a structured-output grammar forces that are verified as "
                        "drafts in one step (0: off; needs no --speculative-config)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="the longest context (prompt plus output) a request may have "
                        "(default: the model's, as far as the KV pool holds it)")
    p.add_argument("--chat-template", default=None,
                   help="a Jinja chat template, or a file holding one, for a model without "
                        "one or to replace its own")
    p.add_argument("--generation-config", default="auto",
                   help="default sampling for requests that leave it unset: auto (the model "
                        "directory's generation_config.json, as vLLM) | vllm (ignore it) | a "
                        "folder holding one")


def engine_kwargs(args: argparse.Namespace) -> dict:
    kw = dict(dtype=args.dtype, device=args.device, quantization=args.quantization,
              kv_cache_memory=args.kv_cache_memory, kv_cache_dtype=args.kv_cache_dtype,
              block_size=args.block_size, max_num_batched_tokens=args.max_num_batched_tokens,
              max_num_seqs=args.max_num_seqs, scheduling_policy=args.scheduling_policy,
              enable_prefix_caching=not args.no_prefix_caching, seed=args.seed,
              enable_lora=args.enable_lora, max_lora_rank=args.max_lora_rank,
              max_loras=args.max_loras,
              num_threads=args.num_threads, speculation_policy=args.speculation_policy,
              jump_forward_tokens=args.jump_forward_tokens,
              generation_config=args.generation_config, max_model_len=args.max_model_len,
              chat_template=args.chat_template)
    if args.speculative_config is not None:
        kw["speculative_config"] = args.speculative_config
    return kw


def make_llm(args: argparse.Namespace):
    from specserve import LLM

    return LLM(args.model, **engine_kwargs(args))


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    # Unset: the model's generation_config.json value (--generation-config), else CLI_SAMPLING.
    p.add_argument("--max-tokens", type=int, default=None, help="default 128")
    p.add_argument("--temperature", type=float, default=None, help="default 0 (greedy)")
    p.add_argument("--top-p", type=float, default=None, help="default 1")
    p.add_argument("--top-k", type=int, default=None, help="default 0 (off)")
    p.add_argument("--min-p", type=float, default=None, help="default 0 (off)")
    p.add_argument("--sample-seed", type=int, default=None)
    p.add_argument("--repetition-penalty", type=float, default=None, help="default 1")
    p.add_argument("--structured-outputs", type=json.loads, default=None,
                   help='one constraint, as vLLM\'s StructuredOutputsParams: {"json": SCHEMA}, '
                        '{"json_object": true}, {"regex": R}, {"choice": [...]} or '
                        '{"grammar": EBNF}')


# The CLI's own defaults where neither a flag nor the model's generation_config.json sets a
# value: greedy, so that a command gives the same answer every time.
CLI_SAMPLING = {"max_tokens": 128, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                "repetition_penalty": 1.0}


def sampling_params(args: argparse.Namespace, model_defaults: dict | None = None):
    """The flags' SamplingParams; a flag left unset takes the model's default (model_defaults,
    LLMEngine.sampling_defaults), else CLI_SAMPLING's."""
    from specserve import SamplingParams, StructuredOutputsParams

    structured = None
    if args.structured_outputs is not None:
        if not isinstance(args.structured_outputs, dict):
            raise ValueError("--structured-outputs takes a JSON object")
        try:
            structured = StructuredOutputsParams(**args.structured_outputs)
        except TypeError as exc:  # an unknown key
            raise ValueError(f"--structured-outputs: {exc}") from None
    flags = {name: getattr(args, name) for name in CLI_SAMPLING}
    values = CLI_SAMPLING | (model_defaults or {}) | {k: v for k, v in flags.items()
                                                     if v is not None}
    return SamplingParams(**values, seed=args.sample_seed, structured_outputs=structured)


def cmd_generate(args: argparse.Namespace) -> None:
    sampling_params(args)  # bad flags fail before the model loads
    llm = make_llm(args)
    params = sampling_params(args, llm.engine.sampling_defaults)
    if args.chat:
        outs = llm.chat([[{"role": "user", "content": p}] for p in args.prompt], params)
    else:
        outs = llm.generate(args.prompt, params)
    for prompt, out in zip(args.prompt, outs, strict=True):
        c = out.outputs[0]
        print(f"--- prompt: {prompt!r}\n{c.text}\n[{len(c.token_ids)} tokens, "
              f"finish={c.finish_reason}, TTFT {out.metrics.ttft * 1e3:.0f} ms]")


def cmd_chat(args: argparse.Namespace) -> None:
    """An interactive chat loop in the terminal, streaming the reply."""
    sampling_params(args)  # bad flags fail before the model loads
    llm = make_llm(args)
    params = sampling_params(args, llm.engine.sampling_defaults)
    engine = llm.engine
    messages: list[dict] = []
    print("specserve chat — empty line or Ctrl-D to quit")
    while True:
        try:
            line = input("> ").strip()
        except EOFError:
            break
        if not line:
            break
        messages.append({"role": "user", "content": line})
        reply = ""
        for out in llm.generate_stream(engine.apply_chat_template(messages), params):
            text = out.outputs[0].text
            sys.stdout.write(text[len(reply):])
            sys.stdout.flush()
            reply = text
        print()
        messages.append({"role": "assistant", "content": reply})


def cmd_bench_offline(args: argparse.Namespace) -> None:
    from specserve.bench.offline import format_table, run_offline

    llm = make_llm(args)
    conc = [int(c) for c in args.concurrency.split(",")]
    print(f"model {llm.engine.model_name} dtype {args.dtype} quantization {args.quantization} "
          f"load {llm.engine.load_time:.1f}s KV blocks {llm.engine.block_manager.num_blocks}")
    # The HF baseline loads the very model the engine runs (and runs on its device).
    results = run_offline(llm, conc, args.input_len, args.output_len, args.compare_hf,
                          model=args.model)
    print(format_table(results))
    stats = llm.get_stats()
    if stats["spec_method"]:
        rate, length = stats["acceptance_rate"], stats["mean_accepted_length"]
        print(f"speculation ({stats['spec_method']}, {stats.get('spec_policy')}): "
              f"{stats['num_draft_tokens']} drafted, {stats['num_accepted_tokens']} accepted, "
              f"acceptance {rate if rate is None else round(rate, 3)}, tokens per verification "
              f"{length if length is None else round(length, 2)}, drafting "
              f"{stats['draft_time_s']:.1f}s, draft weights+KV "
              f"{(stats['draft_weight_bytes'] + stats['draft_kv_cache_bytes']) / 2**20:.0f} MiB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": [r.as_dict() for r in results],
                       "stats": llm.get_stats()}, f, indent=2)


def cmd_bench_profile(args: argparse.Namespace) -> None:
    from specserve.bench.step_profile import format_profile, profile_decode_step

    llm = make_llm(args)
    rows = [profile_decode_step(llm, int(c), args.context) for c in args.concurrency.split(",")]
    print(format_profile(rows))


def cmd_quality(args: argparse.Namespace) -> None:
    from specserve.bench.quality import format_quality, run_quality

    configs: list[dict] = [{}]
    configs += [{"quantization": q} for q in args.quantization.split(",") if q]
    configs += [{"kv_cache_dtype": d} for d in args.kv_cache_dtype.split(",") if d]
    rows = run_quality(configs, args.num_tokens, args.num_prompts, args.max_tokens,
                       dtype=args.dtype, kv_cache_memory=args.kv_cache_memory)
    print(format_quality(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("generate", help="generate text for one or more prompts")
    add_engine_args(p)
    add_sampling_args(p)
    p.add_argument("--prompt", action="append", required=True)
    p.add_argument("--chat", action="store_true", help="wrap each prompt in the chat template")
    p.set_defaults(func=cmd_generate)
    p = sub.add_parser("chat", help="interactive chat in the terminal")
    add_engine_args(p)
    add_sampling_args(p)
    p.set_defaults(func=cmd_chat)
    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="mode", required=True)
    p = bench.add_parser("offline", help="throughput and latency in-process, per concurrency")
    add_engine_args(p)
    p.add_argument("--concurrency", default="1,8,32,64")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--compare-hf", action="store_true",
                   help="also run Hugging Face generate (static batching) on the same prompts")
    p.add_argument("--json", default=None, help="write the results to this JSON file")
    p.set_defaults(func=cmd_bench_offline)
    p = bench.add_parser("profile", help="split a decode step into matmul / attention / other")
    add_engine_args(p)
    p.add_argument("--concurrency", default="1,32")
    p.add_argument("--context", type=int, default=128)
    p.set_defaults(func=cmd_bench_profile)
    p = sub.add_parser("quality", help="perplexity and greedy agreement of quantized modes")
    p.add_argument("--dtype", default="auto", help="auto | bfloat16 | float32 | float16")
    p.add_argument("--quantization", default="int8,int4,gguf,fp8")
    p.add_argument("--kv-cache-dtype", default="int8,fp8_e4m3")
    p.add_argument("--kv-cache-memory", type=parse_memory, default=256 << 20)
    p.add_argument("--num-tokens", type=int, default=8192)
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--json", default=None)
    p.set_defaults(func=cmd_quality)
    from specserve.bench.cli import add_bench_parsers  # bench lab, sweep, online

    add_bench_parsers(bench)
    add_serve_parser(sub)
    add_train_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except ValueError as e:
        sys.exit(f"specserve: error: {e}")


if __name__ == "__main__":
    main()
