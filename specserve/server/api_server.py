"""The OpenAI-compatible HTTP server: app factory, routes, and the process entry point.

    python -m specserve.server.api_server [model] [--port 8000] [--api-key KEY] ...
"""

from __future__ import annotations

import argparse
import gc
import hmac
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from specserve.engine.llm_engine import LLMEngine
from specserve.lora.request import LoRARequest
from specserve.server.async_engine import AsyncEngine
from specserve.server.errors import (
    APIError,
    error_response,
    install_error_handlers,
    lone_surrogate_at,
)
from specserve.server.metrics import CONTENT_TYPE, ServerMetrics
from specserve.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    LoadLoRAAdapterRequest,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
    UnloadLoRAAdapterRequest,
)
from specserve.server.responses import ResponsesRequest
from specserve.server.serving import OpenAIServing

logger = logging.getLogger("specserve.server")

# How much longer than --shutdown-timeout uvicorn waits for open responses: time for those the
# engine aborted at the timeout to send their ending.
ABORT_GRACE_S = 5.0


async def _require_json(request: Request) -> None:
    """415 for a body labelled as anything but JSON (an unlabelled one is parsed as JSON).
    Async so that FastAPI runs it inline: a sync dependency costs every request a hop to a
    worker thread."""
    content_type = request.headers.get("content-type")
    if content_type is None:
        return
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type != "application/json" and not media_type.endswith("+json"):
        raise APIError(415, f"Content-Type must be application/json, not {content_type!r}")


# A UTF-16 surrogate, escaped in JSON (a pair is an emoji: ensure_ascii clients send them so)
# or as raw UTF-8-style bytes (json.loads decodes bytes with surrogatepass): a lone one is a
# string no tokenizer takes and no UTF-8 response can echo.
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


async def _require_unicode(request: Request) -> None:
    """400 for a body holding a lone surrogate (`"\\ud800"`): it reached the tokenizer as a
    TypeError (a 500) or, in an echoed field, failed the response after the whole
    generation. Only a body with a surrogate is looked through (FastAPI has parsed it)."""
    if not _SURROGATE.search(await request.body()):
        return
    try:
        data = await request.json()
    except ValueError:
        return  # FastAPI's own parse reports it
    if (where := lone_surrogate_at(data)) is not None:
        raise APIError(400, f"{where} is not valid Unicode (it holds a lone surrogate)",
                       param=where)


router = APIRouter()
_json_body = [Depends(_require_json), Depends(_require_unicode)]


def _state(request: Request):
    return request.app.state


@router.get("/health")
async def health(request: Request) -> Response:
    engine: AsyncEngine = _state(request).engine
    if not engine.accepting:
        return error_response(503, "the engine is not serving" if engine.dead is None
                              else f"the engine failed: {engine.dead!r}")
    return JSONResponse({"status": "ok"})


@router.get("/version")
async def version() -> JSONResponse:
    """vLLM's: the server's version (the installed package's)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        return JSONResponse({"version": package_version("specserve")})
    except PackageNotFoundError:  # run from a checkout without installing it
        return JSONResponse({"version": "unknown"})


@router.get("/stats")
async def stats(request: Request) -> JSONResponse:
    """The engine's latest stats snapshot (KV blocks, queue lengths, token counts)."""
    engine: AsyncEngine = _state(request).engine
    return JSONResponse({**engine.stats, "num_requests_in_flight": engine.num_in_flight})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(_state(request).metrics.render(), media_type=CONTENT_TYPE)


@router.get("/v1/models")
async def list_models(request: Request) -> ModelList:
    serving: OpenAIServing = _state(request).serving
    base = ModelCard(id=serving.model_name, max_model_len=serving.max_model_len)
    return ModelList(data=[base, *(
        ModelCard(id=name, root=lora.lora_path, parent=serving.model_name,
                  max_model_len=serving.max_model_len) for name, lora in serving.loras.items())])


@router.post("/v1/completions", dependencies=_json_body)
async def create_completion(body: CompletionRequest, request: Request) -> Response:
    return await _state(request).serving.completions(body, request)


@router.post("/v1/chat/completions", dependencies=_json_body)
async def create_chat_completion(body: ChatCompletionRequest, request: Request) -> Response:
    return await _state(request).serving.chat(body, request)


@router.post("/v1/responses", dependencies=_json_body)
async def create_response(body: ResponsesRequest, request: Request) -> Response:
    """OpenAI's Responses API (stateless: the whole conversation comes as input)."""
    return await _state(request).serving.responses(body, request)


@router.post("/tokenize", dependencies=_json_body, response_model=TokenizeResponse)
async def tokenize(body: TokenizeRequest, request: Request) -> Response:
    """vLLM's: a prompt's or a conversation's token ids, as the endpoints above count them."""
    return await _state(request).serving.tokenize(body)


@router.post("/detokenize", dependencies=_json_body, response_model=DetokenizeResponse)
async def detokenize(body: DetokenizeRequest, request: Request) -> Response:
    return await _state(request).serving.detokenize(body)


# vLLM's runtime adapter endpoints, served only with --allow-runtime-lora-updating (vLLM: its
# VLLM_ALLOW_RUNTIME_LORA_UPDATING): whoever may call them decides what code paths the server
# reads weights from.
lora_router = APIRouter()


@lora_router.post("/v1/load_lora_adapter", dependencies=_json_body)
async def load_lora_adapter(body: LoadLoRAAdapterRequest, request: Request) -> Response:
    return await _state(request).serving.load_lora(body)


@lora_router.post("/v1/unload_lora_adapter", dependencies=_json_body)
async def unload_lora_adapter(body: UnloadLoRAAdapterRequest, request: Request) -> Response:
    return await _state(request).serving.unload_lora(body)


class ApiKeyMiddleware:
    """Bearer-token check on /v1 routes and the tokenizer endpoints, before the body is even
    read (so a bad key is a 401 whatever else is wrong). /health, /stats and /metrics stay open
    for probes and scrapers."""

    _PROTECTED = ("/v1", "/tokenize", "/detokenize")

    def __init__(self, app: ASGIApp, api_key: str):
        self.app = app
        self._expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(self._PROTECTED) \
                and scope["method"] != "OPTIONS":
            given = Headers(scope=scope).get("authorization", "").encode()
            if not hmac.compare_digest(given, self._expected):  # constant time
                response = error_response(401, "Missing or incorrect API key. Send it as "
                                               "'Authorization: Bearer <key>'.",
                                          code="invalid_api_key")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """A request body past max_bytes is a 413 before it is read whole: FastAPI parses JSON on the
    event loop, and a 100 MB body would stall every stream for seconds first. Checked on the
    declared Content-Length and, for a chunked body, on the bytes as they arrive."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:  # FastAPI passes an HTTPException on to our handler
                raise HTTPException(413, self._message())
            return message

        await self.app(scope, counted, send)

    def _message(self) -> str:
        return f"the request body is larger than {self.max_bytes} bytes (--max-request-bytes)"

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        await error_response(413, self._message())(scope, receive, send)


def build_app(engine: LLMEngine, *, served_model_name: str | None = None,
              api_key: str | None = None, max_queue: int | None = 256,
              engine_thread: bool = True, stream_interval: int = 1,
              allowed_origins: list[str] | None = None,
              max_request_bytes: int = 64 << 20,
              tool_call_parser: str | None = None,
              reasoning_parser: str | None = None,
              loras: dict[str, LoRARequest] | None = None,
              runtime_lora_updating: bool = False) -> FastAPI:
    """The FastAPI app around a loaded engine. The engine thread starts with the app's lifespan
    and stops with it, aborting whatever is still running. loras: adapters served by name
    beside the base model, each loaded into the engine here."""
    model_name = served_model_name or engine.model_name
    server_metrics = ServerMetrics(model_name, stats=lambda: async_engine.stats,
                                   max_model_len=engine.max_model_len,
                                   cache_config=engine.config.cache)
    async_engine = AsyncEngine(engine, max_queue=max_queue, observer=server_metrics.observe,
                               abort_observer=server_metrics.observe_abort,
                               own_thread=engine_thread, stream_interval=stream_interval)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async_engine.start()
        logger.info("serving %s (max_model_len %d)", model_name, engine.max_model_len)
        try:
            yield
        finally:
            # uvicorn has stopped accepting and waited for open responses; abort the rest.
            await async_engine.shutdown()

    app = FastAPI(title="specserve", lifespan=lifespan)
    app.state.engine = async_engine
    app.state.metrics = server_metrics
    model_arg = engine.config.model
    aliases = (model_arg,) if model_arg and not served_model_name else ()
    for name, lora in (loras or {}).items():
        if name in (model_name, *aliases):
            raise ValueError(f"LoRA adapter name {name!r} is the base model's name")
        engine.add_lora(lora)
    app.state.serving = OpenAIServing(async_engine, model_name, server_metrics, aliases,
                                      tool_call_parser=tool_call_parser,
                                      reasoning_parser=reasoning_parser, loras=loras)
    install_error_handlers(app)
    if api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=api_key)
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_request_bytes)
    if allowed_origins:  # added last, so outermost: a browser's preflight needs no key
        app.add_middleware(CORSMiddleware, allow_origins=allowed_origins, allow_methods=["*"],
                           allow_headers=["*"])
    app.include_router(router)
    if runtime_lora_updating:
        app.include_router(lora_router)
    return app


def run_server(args: argparse.Namespace) -> None:
    """The engine loop runs in this (main) thread, where torch's matmuls are fastest (see
    AsyncEngine); uvicorn serves HTTP from a background thread. SIGTERM/SIGINT ask uvicorn for
    its graceful stop: stop accepting, let open responses finish (up to --shutdown-timeout, or
    until a second SIGINT; then the engine aborts them, and each ends with an error), lifespan
    shutdown, which ends the engine loop; then we exit 0."""
    from specserve.cli import engine_kwargs
    from specserve.llm import build_engine_config
    from specserve.server.cli import check_serve_flags

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    check_serve_flags(args)  # before the model loads
    engine = LLMEngine(build_engine_config(args.model, **engine_kwargs(args)))
    logger.info("loaded %s in %.1fs: %d KV blocks", engine.model_name, engine.load_time,
                engine.block_manager.num_blocks)
    loras = {name: LoRARequest(name, i + 1, path)
             for i, (name, path) in enumerate(args.lora_modules or ())}
    try:
        app = build_app(engine, served_model_name=args.served_model_name, api_key=args.api_key,
                        max_queue=args.max_queue, engine_thread=False,
                        stream_interval=args.stream_interval,
                        allowed_origins=args.allowed_origins,
                        max_request_bytes=args.max_request_bytes,
                        tool_call_parser=args.tool_call_parser if args.enable_auto_tool_choice
                        else None, reasoning_parser=args.reasoning_parser, loras=loras,
                        runtime_lora_updating=args.allow_runtime_lora_updating)
    except ValueError as exc:  # an adapter that does not load or fit
        sys.exit(f"specserve: error: {exc}")
    # uvicorn cancels the responses still open when its graceful timeout runs out (a cut
    # stream, a bare 500); the engine aborts them first (drain), and uvicorn waits a little
    # longer than that for them to end properly.
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            access_log=args.access_log,
                            timeout_graceful_shutdown=args.shutdown_timeout + ABORT_GRACE_S)
    server = uvicorn.Server(config)
    http = threading.Thread(target=server.run, name="specserve-http", daemon=True)
    engine_loop = app.state.engine
    signals = 0

    def stop(sig: int, _frame) -> None:
        # SIGTERM or Ctrl-C lets open responses finish for up to --shutdown-timeout; a Ctrl-C
        # after that aborts them at once, as uvicorn's own handler does; one more stops waiting
        # even for the aborted responses to end.
        nonlocal signals
        signals += 1
        now = signals > 1 and sig == signal.SIGINT
        engine_loop.drain(0.0 if now else args.shutdown_timeout)
        if now and signals > 2:
            server.force_exit = True
        server.should_exit = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    freeze_startup_heap()
    http.start()
    engine_loop.run_in_current_thread(is_alive=http.is_alive)
    if engine_loop.dead is not None:
        # Every request was failed; a server that only answers 503 is better restarted by its
        # supervisor than left up (vLLM's engine-dead path exits too).
        server.should_exit = True
    http.join(timeout=args.shutdown_timeout + ABORT_GRACE_S + 10)
    if not server.started:
        sys.exit("specserve: error: the HTTP server did not start (is the port in use?)")
    if engine_loop.dead is not None:
        sys.exit(f"specserve: error: the engine failed: {engine_loop.dead!r} "
                 "(the traceback is in the log above)")
    if not server.should_exit:  # no signal asked for the stop: the HTTP thread died
        sys.exit("specserve: error: the HTTP server stopped unexpectedly (see the log above)")


def freeze_startup_heap() -> None:
    """Move everything alive after start-up (the model, tokenizer, FastAPI and torch's Python
    objects: ~1M of them) out of the cyclic GC's reach. A full collection otherwise walks them
    all, ~200 ms holding the GIL here, a stall of every stream and of the engine loop each time
    the server's allocations trigger one. Safe because this process serves one engine for its
    whole life: what is frozen would never have become garbage anyway. (vLLM's engine process
    freezes its start-up heap for the same reason.)"""
    gc.collect()
    gc.freeze()


def main(argv: list[str] | None = None) -> None:
    from specserve.server.cli import add_serve_args

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(prog="python -m specserve.server.api_server",
                                     description="OpenAI-compatible server")
    add_serve_args(parser)
    args = parser.parse_args(argv)
    try:
        run_server(args)
    except ValueError as exc:  # bad engine flags
        sys.exit(f"specserve: error: {exc}")


if __name__ == "__main__":
    main()
