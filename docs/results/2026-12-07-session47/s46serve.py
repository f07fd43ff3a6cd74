"""Run session 46's server (the worktree at /tmp/s46wt) past the editable install of main."""
import runpy
import sys

sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__.lower()
                    and "Editable" not in type(f).__name__]
sys.path.insert(0, "/tmp/s46wt")
sys.path_importer_cache.clear()
runpy.run_path("/tmp/s46wt/docs/results/2026-12-02-session15/serve_wrap.py", run_name="__main__")
