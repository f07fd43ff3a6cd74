"""`specserve serve`: the OpenAI-compatible server's flags (the engine's come from specserve.cli).

Nothing heavy is imported here: `specserve --help` must stay fast.
"""

from __future__ import annotations

import argparse
import json
import logging
import os

from specserve.server.reasoning import REASONING_PARSERS
from specserve.server.tool_calls import TOOL_CALL_PARSERS


def add_serve_args(p: argparse.ArgumentParser) -> None:
    # Imported here, not at the top: specserve.cli imports this module while it loads.
    from specserve.cli import add_engine_args

    add_engine_args(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=os.environ.get("SPECSERVE_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 routes "
                        "(default: $SPECSERVE_API_KEY; unset: no authentication)")
    p.add_argument("--max-queue", type=_non_negative_int, default=256,
                   help="requests allowed to wait beyond the --max-num-seqs running ones; "
                        "more get 429, whatever their priority")
    p.add_argument("--stream-interval", type=positive_int, default=1,
                   help="send streamed tokens every N engine steps (first tokens and finished "
                        "requests at once); >1 costs smoothness, saves a wake-up of the HTTP "
                        "thread and every client per step (see docs/performance.md)")
    p.add_argument("--allowed-origins", type=_origins, default=None,
                   help="origins a browser may call the server from (CORS), comma-separated, "
                        "or '*' for any (vLLM allows any by default; default here: none, no "
                        "CORS headers)")
    p.add_argument("--max-request-bytes", type=positive_int, default=64 << 20,
                   help="a larger request body is refused with a 413 before it is parsed "
                        "(default 64 MiB)")
    p.add_argument("--served-model-name", default=None,
                   help="the model name clients must send (default: the model's own name)")
    p.add_argument("--shutdown-timeout", type=_seconds, default=30.0,
                   help="on SIGTERM, seconds to let open responses finish before aborting them")
    p.add_argument("--enable-auto-tool-choice", action="store_true",
                   help='serve tool_choice "auto" (the default when a request has tools): '
                        "the model decides whether to call, read with --tool-call-parser "
                        '("required" and named calls work without it)')
    p.add_argument("--tool-call-parser", choices=sorted(TOOL_CALL_PARSERS), default=None,
                   help="how the model writes a tool call (hermes: <tool_call>{json}"
                        "</tool_call>, as Hermes and Qwen 2.5 models do; llama3_json: a reply "
                        "of JSON calls, as Llama 3.1-3.3 write them)")
    p.add_argument("--reasoning-parser", choices=sorted(REASONING_PARSERS), default=None,
                   help="split a reasoning model's reply into reasoning_content and content "
                        "(deepseek_r1: reasoning up to </think>, as DeepSeek-R1's distilled "
                        "models and QwQ write it)")
    p.add_argument("--lora-modules", nargs="+", type=_lora_module, default=None,
                   metavar="NAME=PATH",
                   help="LoRA adapters to serve beside the base model (with --enable-lora): a "
                        "request whose model is NAME runs the PEFT adapter in directory PATH "
                        '(or JSON {"name": ..., "path": ...}, as vLLM takes them)')
    p.add_argument("--allow-runtime-lora-updating", action="store_true",
                   help="serve vLLM's POST /v1/load_lora_adapter and /v1/unload_lora_adapter "
                        "(with --enable-lora; behind --api-key like /v1)")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--access-log", action="store_true", help="log every HTTP request")


def check_serve_flags(args: argparse.Namespace) -> None:
    """Refuse, before the model loads, a tool or LoRA flag that would do nothing."""
    names = [name for name, _ in args.lora_modules or ()]
    if names and not args.enable_lora:
        raise SystemExit("--lora-modules needs --enable-lora")
    if args.allow_runtime_lora_updating and not args.enable_lora:
        raise SystemExit("--allow-runtime-lora-updating needs --enable-lora")
    if len(set(names)) != len(names):
        raise SystemExit("--lora-modules names each adapter once")
    if args.enable_auto_tool_choice and args.tool_call_parser is None:
        raise SystemExit("--enable-auto-tool-choice needs --tool-call-parser (one of "
                         f"{', '.join(sorted(TOOL_CALL_PARSERS))})")
    if args.tool_call_parser is not None and not args.enable_auto_tool_choice:
        # vLLM starts so too: a script written for it must start here
        logging.getLogger("specserve").warning(
            "--tool-call-parser is read only with --enable-auto-tool-choice: tool_choice "
            '"auto" will be refused')


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (the bench commands' --repeats use it too)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {value}")
    return value


def _lora_module(text: str) -> tuple[str, str]:
    """NAME=PATH, or vLLM's JSON form {"name": ..., "path": ...}: (name, path)."""
    if text.lstrip().startswith("{"):
        try:
            spec = json.loads(text)
            name, path = spec["name"], spec["path"]
        except (ValueError, KeyError, TypeError):
            raise argparse.ArgumentTypeError(
                'expected {"name": ..., "path": ...}') from None
    else:
        name, _, path = text.partition("=")
    if not isinstance(name, str) or not isinstance(path, str) or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {text!r}")
    return name, path


def _origins(text: str) -> list[str]:
    origins = [o.strip() for o in text.split(",") if o.strip()]
    if not origins:
        raise argparse.ArgumentTypeError("expected origins such as https://app.example or '*'")
    return origins


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 <= value < float("inf"):  # NaN too
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text}")
    return value


def _serve(args: argparse.Namespace) -> None:
    from specserve.server.api_server import run_server

    run_server(args)


def add_serve_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("serve", help="run the OpenAI-compatible HTTP server")
    add_serve_args(p)
    p.set_defaults(func=_serve)
    return p
