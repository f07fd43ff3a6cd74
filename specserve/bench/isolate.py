"""Run one benchmark unit in a fresh process and bring its result back.

Why: engines built one after another in one process do not run at the same speed. On this
machine three identical vanilla engines in sequence gave 1045, 1009 and 1005 tok/s (prose,
concurrency 32; docs/results/2026-11-30-session3/order_check.py): the heap and the allocator and
kernel caches that earlier engines leave behind cost the later ones up to 4%, as much as some of
the differences the lab exists to show. So each strategy gets a clean process, spawned rather
than forked (a fork would inherit the parent's heap and torch thread pool).
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.connection
import os
import queue
import threading
import traceback
from collections.abc import Callable
from typing import Any

Progress = Callable[[str, int], None]


def _exit_with_parent() -> None:
    """End this process as soon as its parent is gone. Why: a lab stopped by SIGTERM or SIGKILL
    runs no `finally`, so its worker would run on alone, holding a core and slowing whatever
    the machine measures next (it once failed a timed test)."""
    parent = mp.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _child(q, fn: Callable, args: tuple) -> None:
    _exit_with_parent()

    def progress(desc: str, n: int) -> None:
        q.put(("progress", desc, n))

    try:
        q.put(("done", fn(*args, progress)))
    except BaseException:  # the parent re-raises it with this traceback
        q.put(("error", traceback.format_exc()))


def run_isolated(fn: Callable[..., Any], args: tuple, progress: Progress) -> Any:
    """`fn(*args, progress)` in a fresh process. fn must be a module-level function and its
    arguments and result picklable. Its progress calls reach `progress` here as they happen;
    its exception comes back as a RuntimeError that carries the child's traceback."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=_child, args=(q, fn, args), daemon=True)
    proc.start()
    try:
        while True:
            try:
                kind, *payload = q.get(timeout=1.0)
            except queue.Empty:
                if proc.is_alive():
                    continue
                try:  # it may have put its last message and exited since the get timed out
                    kind, *payload = q.get(timeout=1.0)
                except queue.Empty:
                    raise RuntimeError(
                        f"the benchmark process died without a result (exit code {proc.exitcode}"
                        "; its output is above). A script that runs the lab must guard its top "
                        "level with `if __name__ == '__main__':` (the process is spawned)"
                    ) from None
            if kind == "progress":
                progress(*payload)
            elif kind == "done":
                return payload[0]
            else:
                raise RuntimeError(f"the benchmark process failed:\n{payload[0]}")
    except BaseException:  # e.g. Ctrl-C: stop the worker now rather than wait for it
        proc.kill()
        raise
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
