"""Start `specserve serve` (or serve_wrap.py) in a subprocess and wait until it answers /health;
shared by this session's scripts (run from the repo root)."""
import os, subprocess, time, urllib.request

SERVE_WRAP = ".venv/bin/python docs/results/2026-12-02-session15/serve_wrap.py"


def launch(port: int, args=(), env=None, cmd: str = SERVE_WRAP) -> subprocess.Popen:
    """Start a server without waiting for it (several can load side by side)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.Popen(cmd.split() + ["--port", str(port), "--log-level", "warning",
                                           *args], env=env)


def wait_healthy(port: int, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health")
            return
        except Exception:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no server answered on port {port} in {timeout_s:.0f} s")
            time.sleep(1)
