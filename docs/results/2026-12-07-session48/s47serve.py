"""Run session 47's server (the worktree at /tmp/s47wt) past the editable install of main."""
import runpy
import sys

sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in type(f).__module__.lower()
                    and "Editable" not in type(f).__name__]
sys.path.insert(0, "/tmp/s47wt")
sys.path_importer_cache.clear()
runpy.run_path("/tmp/s47wt/docs/results/2026-12-02-session15/serve_wrap.py", run_name="__main__")
