"""b94e777's cost model and profiler, loaded beside this tree's (for the A/B scripts)."""
import subprocess, sys, tempfile
from pathlib import Path

OLD = "b94e777"


def old_profiler():
    """b94e777's cost_model.py and profiler.py, the profiler importing the old cost model."""
    tmp = Path(tempfile.mkdtemp())
    for name in ("cost_model", "profiler"):
        src = subprocess.run(["git", "show", f"{OLD}:specserve/spec_decode/{name}.py"],
                             capture_output=True, text=True, check=True).stdout
        src = src.replace("from specserve.spec_decode.cost_model import", "from old_cost_model import")
        (tmp / f"old_{name}.py").write_text(src)
    sys.path.insert(0, str(tmp))
    import old_profiler
    return old_profiler
