"""Drive the single-threaded LLMEngine from asyncio.

One background thread owns the engine: it alone calls add_request / step / abort_request, so the
engine needs no locks. The event loop talks to it only by messages. Commands (add, abort, stop)
go into an inbox guarded by a condition variable; the engine thread drains the inbox before every
step and sleeps on the condition when it has nothing to do. Outputs travel back once per
step (or every `stream_interval` steps) through `loop.call_soon_threadsafe`, into one
OutputStream per API request.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from specserve.engine.llm_engine import LLMEngine
from specserve.lora.request import LoRARequest
from specserve.outputs import RequestOutput
from specserve.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

# An idle engine loop wakes this often even with nothing to do. In `specserve serve` the loop is
# the process's main thread, the only one where Python runs signal handlers, and a SIGTERM
# delivered to another of the process's threads (the HTTP thread, torch's pool, ...) interrupts
# no wait of the main thread: its handler then waited for the next request, and an idle server
# ignored SIGTERM for good.
IDLE_WAKE_S = 0.5
# While the engine is busy, its stats snapshot (/stats, /metrics' engine gauges and counters)
# is refreshed at most this often: a Prometheus scrape comes every 15 s or so.
STATS_INTERVAL_S = 0.25

# Called on the event loop for every output as it is delivered, and whether it is that request's
# first; used for latency metrics. It runs there, not on the engine thread, because every
# microsecond on the engine thread between forwards is a microsecond of every request's step.
OutputObserver = Callable[[RequestOutput, bool], None]
# Called on the event loop for each engine request that ends unfinished (its client went away,
# the server shut down, the engine failed), with its latest output (None before its first) and
# when it arrived (time.perf_counter()).
AbortObserver = Callable[[RequestOutput | None, float], None]


class EngineDeadError(RuntimeError):
    """The engine loop crashed; no request can be served any more."""


class EngineClosedError(RuntimeError):
    """The server is shutting down and takes no new requests."""


class QueueFullError(RuntimeError):
    """More requests are waiting than the server is willing to queue."""


class RequestAborted(RuntimeError):
    """The engine dropped the request before it finished (shutdown)."""


class OutputStream:
    """The outputs of one API request, which may fan out to several engine requests (n choices,
    or a batch of prompts). Iterating yields `(index, output)`, index into `request_ids`, until
    every one has finished. Closing it aborts the ones still running."""

    def __init__(self, owner: AsyncEngine, request_ids: list[str], arrival: float):
        self.request_ids = request_ids
        self._owner = owner
        # A deque and one future rather than an asyncio.Queue: the queue looks the running loop
        # up on every get, a getpid() system call each time (~10% of the HTTP thread's busy
        # time at concurrency 1, by py-spy).
        # Choices with an unread output, in the order they got one (and a failure), and each
        # one's latest output.
        self._items: deque[int | BaseException] = deque()
        self._pending: dict[int, RequestOutput] = {}
        self._waiter: asyncio.Future | None = None
        self._unfinished = set(range(len(request_ids)))
        self._delivered = [False] * len(request_ids)  # the metrics observer's "first output"
        # For the abort observer: when the request came, its choices' latest outputs, and
        # whether the engine took it (a refused one is no abort).
        self._arrival = arrival
        self._last_output: list[RequestOutput | None] = [None] * len(request_ids)
        self._admitted = False  # set on the engine thread, before the add is answered

    def __aiter__(self) -> OutputStream:
        return self

    async def __anext__(self) -> tuple[int, RequestOutput]:
        while not self._items:
            if not self._unfinished:
                raise StopAsyncIteration
            self._waiter = self._owner._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._items.popleft()
        if isinstance(item, BaseException):
            raise item
        return item, self._pending.pop(item)

    def _push(self, item: tuple[int, RequestOutput] | BaseException) -> None:
        # Outputs carry the text and tokens so far: one still waiting for a consumer that fell
        # behind is superseded by the next one of the same choice (one SSE chunk, not two).
        # Per choice, not just behind the same choice: n choices alternate, and a client that
        # stopped reading queued a full copy of every choice at every step (n = 8 x 4,000
        # tokens with logprobs: ~1 GB for one request).
        if isinstance(item, BaseException):
            self._items.append(item)
        else:
            index, out = item
            if index not in self._pending:
                self._items.append(index)
            self._pending[index] = out
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def close(self) -> None:
        """Abort whatever has not finished; idempotent. The KV blocks are freed on the engine
        thread before its next step."""
        if self._unfinished:
            ids = [self.request_ids[i] for i in self._unfinished]
            self._observe_aborts()
            self._owner._release(len(self._unfinished))
            self._unfinished.clear()
            self._owner._submit(_Abort(ids))

    def _observe_aborts(self) -> None:
        observe = self._owner._abort_observer
        if observe is not None and self._admitted:
            for i in self._unfinished:
                observe(self._last_output[i], self._arrival)

    # ---- event-loop side of delivery --------------------------------------------------------
    def _put(self, index: int, out: RequestOutput, now: float) -> None:
        if index not in self._unfinished:
            return  # closed by the consumer meanwhile
        observer = self._owner._observer
        if observer is not None:
            observer(out, not self._delivered[index])
            self._delivered[index] = True
        self._last_output[index] = out
        self._push((index, out))
        if out.finished:
            self._unfinished.discard(index)
            self._owner._release(1)

    def _fail(self, exc: BaseException) -> None:
        if self._unfinished:
            self._observe_aborts()
            self._owner._release(len(self._unfinished))
            self._unfinished.clear()
            self._push(exc)


# ---- commands for the engine thread -------------------------------------------------------------
@dataclass(slots=True)
class _Add:
    output: OutputStream
    prompts: Sequence[str | list[int]]
    params: Sequence[SamplingParams]
    stream_text: bool
    done: asyncio.Future
    priority: int = 0
    lora_request: LoRARequest | None = None
    compiled: dict[int, Any] = field(default_factory=dict)  # id(structured_outputs) -> grammar


@dataclass(slots=True)
class _Abort:
    request_ids: list[str]


@dataclass(slots=True)
class _Stop:
    pass


@dataclass(slots=True)
class _Route:
    """Where the outputs of one engine request go (engine-thread state)."""

    stream: OutputStream
    index: int
    delivered: bool = False  # an output has gone out (the next is not a first token)


@dataclass
class _Inbox:
    cond: threading.Condition = field(default_factory=threading.Condition)
    commands: list[_Add | _Abort | _Stop] = field(default_factory=list)


class AsyncEngine:
    """asyncio front of an LLMEngine running in its own thread.

    By default `start()` spawns that thread. `specserve serve` instead runs the engine loop in
    the process's main thread (`run_in_current_thread`) and HTTP in a background thread:
    measured here, torch's OpenMP matmuls issued from a non-main Python thread ran 1.5-3x slower
    (libgomp throttles its worker team once it manages more threads than there are cores), which
    cost the server ~35% of the offline throughput."""

    def __init__(self, engine: LLMEngine, max_queue: int | None = None,
                 observer: OutputObserver | None = None, own_thread: bool = True,
                 stream_interval: int = 1, abort_observer: AbortObserver | None = None):
        if stream_interval < 1:
            raise ValueError(f"stream_interval must be at least 1, got {stream_interval}")
        self.engine = engine
        # Hand outputs to the event loop every `stream_interval` engine steps (first tokens
        # and finished requests at once). Each hand-off wakes the HTTP thread and every
        # client, and on a small CPU each wake-up takes a core from the forward's OpenMP team,
        # which then waits for it: >1 trades smooth streaming for throughput (SGLang's and
        # vLLM's --stream-interval make the same trade, counted in tokens).
        self.stream_interval = stream_interval
        # Admission limit: what the engine can run at once plus `max_queue` waiting.
        self.max_in_flight = (None if max_queue is None
                              else engine.config.scheduler.max_num_seqs + max_queue)
        self._observer = observer
        self._abort_observer = abort_observer
        self._inbox = _Inbox()
        self._own_thread = own_thread
        self._thread = threading.Thread(target=self._run, name="specserve-engine", daemon=True)
        self._started = threading.Event()  # the event loop is known: the engine loop may run
        self._finished = threading.Event()  # the engine loop has returned
        self._peer_alive = lambda: True  # run_in_current_thread: whether the HTTP thread lives
        self._abort_at: float | None = None  # drain(): when the engine loop aborts what runs
        self._loop: asyncio.AbstractEventLoop | None = None
        self._routes: dict[str, _Route] = {}  # engine thread only
        self._num_in_flight = 0  # event loop only: engine requests accepted and not finished
        self._closing = False
        self._drain_deadline: float | None = None  # drain()'s deadline, kept once it passed
        self._stopped = False  # set (under the inbox lock) when the engine thread exits
        self.dead: BaseException | None = None
        # A snapshot of engine.get_stats(), replaced (never mutated) by the engine thread after
        # every iteration, so that other threads never touch the engine.
        self.stats: dict = engine.get_stats()

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        """Call from inside the event loop that will consume outputs. Starts the engine thread,
        or, without one, lets `run_in_current_thread` go ahead."""
        self._loop = asyncio.get_running_loop()
        if self._own_thread:
            self._thread.start()
        self._started.set()

    def run_in_current_thread(self, is_alive=lambda: True) -> None:
        """Run the engine loop here until shutdown. Waits for `start()` first, giving up if
        `is_alive()` (the HTTP thread) turns False before that, and stops once idle if it
        turns False later: an HTTP thread that died without its lifespan shutdown (which sends
        the stop) would otherwise leave a process that looks up and serves nothing."""
        self._peer_alive = is_alive
        while not self._started.wait(0.1):
            if not is_alive():
                return
        self._run()

    @property
    def _running(self) -> bool:
        return self._started.is_set() and not self._finished.is_set() and (
            not self._own_thread or self._thread.is_alive())

    @property
    def accepting(self) -> bool:
        return not self._closing and self.dead is None and self._running

    @property
    def num_in_flight(self) -> int:
        return self._num_in_flight

    async def shutdown(self) -> None:
        """Refuse new requests, abort the ones in flight (their consumers get RequestAborted)
        and stop the thread. The time to let them finish comes before (`drain`)."""
        self._closing = True
        self._drain_deadline = time.monotonic()  # no step of an open request either
        if self._running:
            self._submit(_Stop())
            await asyncio.to_thread(self._finished.wait, 30.0)

    def drain(self, timeout: float) -> None:
        """Refuse new requests, and abort whatever still runs `timeout` seconds from now (0: at
        the engine loop's next turn). The engine loop does the aborting, so each open response
        ends properly (a stream with an error event and `[DONE]`, a non-streaming request with
        a 503) before the HTTP server, given a few seconds more, gives up on it and cuts it.
        Only stores fields: safe to call from a signal handler."""
        self._closing = True
        deadline = time.monotonic() + timeout
        if self._abort_at is None or deadline < self._abort_at:
            self._abort_at = deadline
            self._drain_deadline = deadline

    # ---- the API used by request handlers (event loop) ----------------------------------------
    async def add_requests(self, request_ids: list[str], prompts: Sequence[str | list[int]],
                           params: Sequence[SamplingParams], stream: bool = False,
                           priority: int = 0, lora_request: LoRARequest | None = None,
                           continuing: bool = False) -> OutputStream:
        """Queue a group of engine requests, all or none. With `stream`, every output carries
        the text so far (incremental detokenization); otherwise only the final one has text.
        Raises ValueError for input the engine refuses, QueueFullError past the admission
        limit, EngineClosedError at shutdown. continuing: the next step of an HTTP request
        already admitted (a beam search's), which neither a full queue nor a drain refuses
        until the drain's deadline: the drain lets open responses finish."""
        # The request's arrival, as vLLM's front end stamps it: its TTFT and queue time include
        # the grammar compilation below and the wait for the engine thread's current step.
        arrival = time.perf_counter()
        self._check_open(continuing)
        self.check_admissible(len(request_ids))
        if (self.max_in_flight is not None and not continuing
                and self._num_in_flight + len(request_ids) > self.max_in_flight):
            raise QueueFullError(f"too many requests in flight ({self._num_in_flight}); "
                                 "retry later")
        # Its place is taken before its grammars compile: a server over its queue refuses a
        # structured request at once rather than after compiling it.
        self._num_in_flight += len(request_ids)
        try:
            # Structured outputs compile here, off the engine thread, so that a slow schema
            # never stalls a step; the engine thread is handed the compiled grammars.
            compiled: dict[int, Any] = {}
            for key, p in {id(p.structured_outputs): p for p in params
                           if p.structured_outputs is not None}.items():
                compiled[key] = await asyncio.to_thread(self.engine.compile_grammar, p)
            self._check_open(continuing)  # it may have closed while they compiled
        except BaseException:
            self._release(len(request_ids))
            raise
        output_stream = OutputStream(self, request_ids, arrival)
        done = self._loop.create_future()
        self._submit(_Add(output_stream, prompts, params, stream, done, priority, lora_request,
                          compiled))
        try:
            await done
        except BaseException:
            # Refused (nothing was added) or the caller went away while waiting (abort whatever
            # the engine thread added meanwhile: the abort is queued behind the add).
            output_stream.close()
            raise
        return output_stream

    # ---- plumbing -----------------------------------------------------------------------------
    def _submit(self, command: _Add | _Abort | _Stop) -> None:
        with self._inbox.cond:
            if not self._stopped:
                self._inbox.commands.append(command)
                self._inbox.cond.notify()
                return
        # The engine thread is gone: nobody will ever answer this command.
        if isinstance(command, _Add) and not command.done.done():
            command.done.set_exception(
                EngineDeadError("the engine has stopped after an error") if self.dead
                else EngineClosedError("the server is shutting down"))

    def check_admissible(self, num_sequences: int) -> None:
        """ValueError for a request of more sequences than the server admits at once: waiting
        would not help, it can never be admitted."""
        if self.max_in_flight is not None and num_sequences > self.max_in_flight:
            raise ValueError(f"this request needs {num_sequences} sequences (prompts x n), "
                             f"more than the server admits at once ({self.max_in_flight})")

    def _check_open(self, continuing: bool = False) -> None:
        if self.dead is not None:
            raise EngineDeadError("the engine has stopped after an error")
        if continuing and self._running and (self._drain_deadline is None
                                             or time.monotonic() < self._drain_deadline):
            return  # draining, before the deadline: an open response goes on
        if not self.accepting:
            raise EngineClosedError("the server is shutting down")

    def _release(self, n: int) -> None:
        self._num_in_flight -= n

    def _resolve(self, fut: asyncio.Future, result: Any = None,
                 exc: BaseException | None = None) -> None:
        """Complete a future from the engine thread (the loop may have cancelled it)."""
        def complete() -> None:
            if fut.done():
                return
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(result)
        self._loop.call_soon_threadsafe(complete)

    # ---- the engine thread --------------------------------------------------------------------
    def _run(self) -> None:
        exit_error: BaseException = RequestAborted("the server is shutting down")
        try:
            self._serve()
        except Exception as exc:
            logger.exception("the engine loop failed; failing all requests")
            self.dead = exc
            exit_error = EngineDeadError(f"the engine failed: {exc!r}")
        finally:
            with self._inbox.cond:
                self._stopped = True
                leftovers, self._inbox.commands = self._inbox.commands, []
            self._abort_all(exit_error)
            for command in leftovers:
                if isinstance(command, _Add):
                    self._resolve(command.done, exc=exit_error)
            self._finished.set()

    def _serve(self) -> None:
        engine = self.engine
        # A step's outputs go out while the next step's forward runs (see LLMEngine.step), or
        # at once when there is no next step. Outputs carry everything so far, so a request's
        # newer output replaces an older one still held back by the stream interval.
        pending: dict[str, RequestOutput] = {}
        steps_held = 0
        stats_time = time.monotonic()

        def deliver_pending(force: bool = False) -> None:
            nonlocal steps_held
            if not pending:
                return
            steps_held += 1
            if force or steps_held >= self.stream_interval or self._urgent(pending.values()):
                self._dispatch(list(pending.values()))
                pending.clear()
                steps_held = 0

        while True:
            if self._abort_at is not None and time.monotonic() >= self._abort_at:
                self._abort_at = None
                deliver_pending(force=True)  # what finished in the last step is not aborted
                if self._routes:
                    logger.warning("aborting %d requests still running at shutdown",
                                   len(self._routes))
                    self._abort_all(RequestAborted("the server is shutting down"))
            stop = False
            for command in self._take_commands():
                if isinstance(command, _Stop):
                    stop = True  # still handle the rest: aborts free blocks, adds get aborted
                else:
                    self._handle(command)
            if stop:
                deliver_pending(force=True)
                return
            finished = False
            if engine.has_unfinished_requests():
                for out in engine.step(on_forward=deliver_pending):
                    finished |= out.finished
                    held = pending.get(out.request_id)
                    if held is not None and held.metrics is not None and out.metrics is not None:
                        # The newer output carries everything so far but its own step's gap.
                        held.metrics.inter_token_latencies += out.metrics.inter_token_latencies
                        out.metrics.inter_token_latencies = held.metrics.inter_token_latencies
                    pending[out.request_id] = out
            idle = not engine.has_unfinished_requests()
            # Refreshed at most every STATS_INTERVAL_S while busy, and before a finished
            # request's output goes out (its client's next scrape then sees it): a snapshot is
            # ~40 figures and, with a proposer, an acceptance estimate per running request,
            # work on the engine thread that no step needs.
            now = time.monotonic()
            if idle or finished or now - stats_time >= STATS_INTERVAL_S:
                self.stats, stats_time = engine.get_stats(), now
            if idle:
                deliver_pending(force=True)

    def _urgent(self, outputs) -> bool:
        """A first token (time to first token) or a finished request (its client, closed-loop,
        sends the next one) is not held back by the stream interval."""
        routes = self._routes
        return any(o.finished or (r := routes.get(o.request_id)) is not None and not r.delivered
                   for o in outputs)

    def _take_commands(self) -> list[_Add | _Abort | _Stop]:
        inbox = self._inbox
        with inbox.cond:
            # Sleep while there is neither a command nor a request to step, waking every
            # IDLE_WAKE_S to run signal handlers and to notice a dead HTTP thread.
            while not inbox.commands and not self.engine.has_unfinished_requests():
                if not inbox.cond.wait(IDLE_WAKE_S) and not self._peer_alive():
                    logger.error("the HTTP thread is gone; stopping the engine loop")
                    return [_Stop()]
            commands, inbox.commands = inbox.commands, []
        return commands

    def _handle(self, command: _Add | _Abort) -> None:
        if isinstance(command, _Abort):
            for rid in command.request_ids:
                self.engine.abort_request(rid)
                self._routes.pop(rid, None)
        else:
            self._add(command)

    def _add(self, command: _Add) -> None:
        added: list[str] = []
        try:
            for rid, prompt, params in zip(command.output.request_ids, command.prompts,
                                           command.params, strict=True):
                self.engine.add_request(prompt, params, request_id=rid,
                                        stream=command.stream_text,
                                        arrival_time=command.output._arrival,
                                        priority=command.priority,
                                        lora_request=command.lora_request, load_lora=False,
                                        compiled_grammar=command.compiled.get(
                                            id(params.structured_outputs)))
                added.append(rid)
        except Exception as exc:  # all or none: take back the ones already queued
            for rid in added:
                self.engine.abort_request(rid)
            self._resolve(command.done, exc=exc)
            return
        for index, rid in enumerate(added):
            self._routes[rid] = _Route(command.output, index)
        # Before the answer is queued: an abort observed after it (a dead engine, a drain)
        # must count, even one that reaches the event loop before the waiting handler resumes.
        command.output._admitted = True
        self._resolve(command.done)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        batch: list[tuple[OutputStream, int, RequestOutput]] = []
        for out in outputs:
            route = self._routes.get(out.request_id)
            if route is None:
                continue  # aborted by its consumer in the meantime
            if out.finished:
                del self._routes[out.request_id]
            route.delivered = True
            batch.append((route.stream, route.index, out))
        if batch:
            # One wake-up of the event loop per step, however many requests it served.
            self._loop.call_soon_threadsafe(_deliver, batch)

    def _abort_all(self, exc: BaseException) -> None:
        streams = {id(r.stream): r.stream for r in self._routes.values()}
        for rid in list(self._routes):
            try:
                self.engine.abort_request(rid)
            except Exception:  # the engine may be broken; the consumers must still hear of it
                logger.exception("abort of %s failed", rid)
        self._routes.clear()
        self.stats = self._safe_stats()
        for stream in streams.values():
            self._loop.call_soon_threadsafe(stream._fail, exc)

    def _safe_stats(self) -> dict:
        try:
            return self.engine.get_stats()
        except Exception:
            return self.stats


def _deliver(batch: list[tuple[OutputStream, int, RequestOutput]]) -> None:
    now = time.perf_counter()
    for stream, index, out in batch:
        stream._put(index, out, now)
