"""Summarise py-spy's raw stacks (prof_http.py's output) for the HTTP thread: inclusive and leaf
shares of its samples. Usage: python http_thread_profile.py [/tmp/prof.txt]"""
import collections
import sys

incl, leaf, threads, total = collections.Counter(), collections.Counter(), collections.Counter(), 0
for line in open(sys.argv[1] if len(sys.argv) > 1 else "/tmp/prof.txt"):
    stack, _, n = line.rstrip().rpartition(" ")
    n, frames = int(n), stack.split(";")
    threads[frames[0]] += n
    if "specserve-http" not in frames[0]:
        continue
    total += n
    names = [f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0].split("/")[-1]
             if " (" in f else f for f in frames[1:]]
    leaf[names[-1] if names else "?"] += n
    for f in set(names):
        incl[f] += n
for th, c in threads.most_common():
    print(f"  {c:6d} {th}")
print(f"\nHTTP thread, {total} samples: inclusive share of the top frames")
for f, c in incl.most_common(45):
    print(f"{c / total * 100:5.1f}% {f}")
print("\nHTTP thread: leaf (self) share")
for f, c in leaf.most_common(25):
    print(f"{c / total * 100:5.1f}% {f}")
