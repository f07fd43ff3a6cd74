"""A `specserve serve` whose HTTP thread dies 3 s after start-up (uvicorn's main loop raises):
the process should exit non-zero, not idle forever."""
import asyncio, sys, time
import uvicorn
from specserve.server import api_server

async def dying_main_loop(self):
    await asyncio.sleep(3)
    raise RuntimeError("simulated crash of the HTTP thread")

uvicorn.Server.main_loop = dying_main_loop
t0 = time.time()
try:
    api_server.main(["--port", "8799", "--log-level", "warning"])
finally:
    print(f"exited after {time.time() - t0:.1f} s", file=sys.stderr)
