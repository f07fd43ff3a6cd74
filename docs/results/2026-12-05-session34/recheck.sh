#!/bin/bash
# Session 33's n-gram sweep points where adaptive read under 0.97x the best other policy or
# under off, rerun with more rounds (6) and more prompts per run on one engine each
# (overhead_split.py). Run from the repository root; writes recheck-*.txt beside this script.
set -e
D=docs/results/2026-12-05-session34
run() {  # name, then env assignments
  name=$1; shift
  env "$@" .venv/bin/python $D/overhead_split.py 2>&1 | grep -v Warn > $D/recheck-$name.txt
}
run prose-c1 WORKLOAD=prose C=1 N=24 ROUNDS=6 POLICIES=off,static:2,adaptive
run prose-c2 WORKLOAD=prose C=2 N=32 ROUNDS=6 POLICIES=off,static:2,adaptive
run json-c4 WORKLOAD=json C=4 N=32 ROUNDS=6 POLICIES=off,static:2,adaptive
run rag-c4 WORKLOAD=rag C=4 N=16 ROUNDS=6 POLICIES=off,adaptive
run prose-c16 WORKLOAD=prose C=16 N=32 ROUNDS=6 POLICIES=off,adaptive
run rag-c64 WORKLOAD=rag C=64 N=64 ROUNDS=6 POLICIES=off,adaptive
