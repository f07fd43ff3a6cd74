"""`specserve serve` with uvicorn's HTTP stack forced: IMPL is h11 (with asyncio) or httptools
(with uvloop; `pip install uvloop httptools`). Usage: serve_impl.py IMPL [serve flags...]"""

import sys

import uvicorn

from specserve.server.api_server import main

IMPL = sys.argv.pop(1)
_init = uvicorn.Config.__init__


def _config_init(self, *args, **kwargs):
    kwargs.setdefault("http", IMPL)
    kwargs.setdefault("loop", "asyncio" if IMPL == "h11" else "uvloop")
    _init(self, *args, **kwargs)


uvicorn.Config.__init__ = _config_init
main(sys.argv[1:])
