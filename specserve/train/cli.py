"""`specserve train-draft`: flags to a DataConfig and a DistillConfig / EagleConfig, then
train/pipeline.py does the work."""

from __future__ import annotations

import argparse
from pathlib import Path

from specserve.server.cli import positive_int


def add_train_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "train-draft", help="train a small draft for a target in minutes",
        description="Train a draft on the target's own replies: --method draft distils "
                    "the target's first layers into a small model, --method eagle trains an "
                    "EAGLE head over the target's features; use it with --speculative-config "
                    "'{\"method\": \"draft\" or \"eagle\", \"model\": OUT}'.")
    p.add_argument("--method", default="draft", choices=("draft", "eagle"))
    p.add_argument("--model", default=None,
                   help="the target: a local HF directory or .gguf (default: the embedded model)")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompts", help="JSON Lines, one of messages / prompt / "
                                          "prompt_token_ids per line (optional kind)")
    source.add_argument("--workload", help="benchmark workloads, e.g. prose or prose,json")
    p.add_argument("--minutes", type=float, required=True,
                   help="wall-clock budget of the training loop")
    p.add_argument("--out", required=True, help="directory to write the draft to")
    p.add_argument("--layers", type=int, default=3, help="draft layers (the target's first N)")
    p.add_argument("--head-vocab", type=int, default=8192,
                   help="ids in the draft's LM head, by target probability mass (0: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-reply-tokens", type=int, default=128)
    p.add_argument("--replies-per-prompt", type=int, default=4,
                   help="replies generated per training prompt: the greedy one plus sampled "
                        "ones (held-out prompts get the greedy reply only)")
    p.add_argument("--reply-temperature", type=float, default=1.0,
                   help="temperature of the sampled replies")
    p.add_argument("--max-context", type=int, default=1024,
                   help="prompt tokens beyond this are dropped from the left while training "
                        "(held-out prompts are read whole, as served)")
    p.add_argument("--lr", type=float, default=None,
                   help="learning rate (default: 5e-4 for draft, 1e-3 for eagle)")
    p.add_argument("--feature-layers", default=None,
                   help="eagle: target layers whose outputs the head fuses beside the final "
                        "feature, e.g. 2,14 (default: a low and a middle one; none: the final "
                        "feature only)")
    p.add_argument("--eval-every", type=int, default=20, help="steps between evaluations")
    p.add_argument("--max-steps", type=positive_int, default=None,
                   help="stop after this many steps (the budget still applies); the learning "
                        "rate then follows the steps, not the clock, so the same seed gives the "
                        "same draft however loaded the machine is (on a CPU of the same kind: "
                        "bf16 or fp32 training is the CPU's choice)")
    p.add_argument("--dtype", default="auto",
                   help="the dtype the target is served in: the engine's while generating the "
                        "data, and the teacher's")
    p.add_argument("--num-threads", type=int, default=None)
    p.set_defaults(func=cmd_train_draft)


def cmd_train_draft(args: argparse.Namespace) -> None:
    from specserve.train.data import DataConfig, read_prompts_jsonl, workload_prompts
    from specserve.train.pipeline import summary, train_draft, train_eagle_head

    items = read_prompts_jsonl(args.prompts) if args.prompts else workload_prompts(args.workload)
    # An absolute path: the lab reads the file again to know which prompts were trained on.
    source = (f"prompts:{Path(args.prompts).resolve()}" if args.prompts
              else f"workload:{args.workload}")
    data_cfg = DataConfig(max_reply_tokens=args.max_reply_tokens,
                          replies_per_prompt=args.replies_per_prompt,
                          reply_temperature=args.reply_temperature, dtype=args.dtype)
    common = dict(data_cfg=data_cfg, num_threads=args.num_threads, source=source)
    if args.method == "eagle":
        from specserve.train.eagle import EagleConfig

        cfg = EagleConfig(head_vocab=args.head_vocab, minutes=args.minutes, seed=args.seed,
                          lr=args.lr if args.lr is not None else 1e-3,
                          eval_every=args.eval_every, max_context=args.max_context,
                          feature_layers=_layers(args.feature_layers),
                          max_steps=args.max_steps)
        outcome = train_eagle_head(args.model, items, args.out, cfg, **common)
    else:
        from specserve.train.distill import DistillConfig

        cfg = DistillConfig(num_layers=args.layers, head_vocab=args.head_vocab,
                            minutes=args.minutes, seed=args.seed,
                            lr=args.lr if args.lr is not None else 5e-4,
                            eval_every=args.eval_every, max_context=args.max_context,
                            max_steps=args.max_steps)
        outcome = train_draft(args.model, items, args.out, cfg, **common)
    print(summary(outcome))


def _layers(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    if text.strip().lower() == "none":
        return ()
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise SystemExit(f"--feature-layers: expected layer numbers like 2,14 or none, got "
                         f"{text!r}") from None
