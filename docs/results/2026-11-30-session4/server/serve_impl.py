import sys
import uvicorn
impl = sys.argv.pop(1)
orig = uvicorn.Config.__init__
def init(self, *a, **k):
    k.setdefault("http", impl)
    k.setdefault("loop", "asyncio" if impl == "h11" else "uvloop")
    orig(self, *a, **k)
uvicorn.Config.__init__ = init
from specserve.server.api_server import main
main(sys.argv[1:])
