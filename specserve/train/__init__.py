"""Train a small draft for a target in minutes: distil its first layers on its own replies.

data.py generates the target's greedy replies with the engine; batches.py caches the target's
side; dense_forward.py is the non-paged forward training needs; draft_net.py and distill.py
build and train the draft; report.py measures greedy agreement before and after; save.py
writes the directory that `load_model` and the draft proposer read back; pipeline.py runs it
all; cli.py is `specserve train-draft`.
"""
