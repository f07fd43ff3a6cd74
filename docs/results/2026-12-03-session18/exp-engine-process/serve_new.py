"""The server of the working tree. DURING_FWD=1: the engine process hands outputs over during
the next forward, as the in-thread server does (for the A/B)."""
import os, sys
from specserve.cli import main
if __name__ == "__main__":
    if os.environ.get("DURING_FWD"):
        import specserve.server.engine_core as ec
        ec._PipeLoop.deliver_during_forward = True
    sys.argv = ["specserve", "serve"] + sys.argv[1:]
    main()
