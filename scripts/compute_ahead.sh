#!/usr/bin/env bash
# Chapter 3's paper profile computed ahead with the factored DMFT engine, so that the chapter moves to it without
# ever showing CI-scale results in between (README, "Chapter 3's move to the factored engine").
#
# Commit AHEAD on main switches chapter 3's DMFT runs to dmft.run_dmft_factored; the commit after it reverts that
# switch until its results exist. This script runs the sweeps with AHEAD's code (a detached worktree, TREE) into
# results-ahead/paper, and commits each finished batch of units on main as it lands; the units' records name
# AHEAD's commit. Resumable: run it again in a later session, and it goes on where the last one stopped.
#
#   bash scripts/compute_ahead.sh                    # every ch3 experiment that runs the DMFT, cheapest first
#   bash scripts/compute_ahead.sh ch3.dnn            # one of them
#   STATUS=1 bash scripts/compute_ahead.sh           # how far it is (`status` of that store, AHEAD's code)
#
# The move, when STATUS says the six ch3 experiments below current, is `bash scripts/move_ahead.sh`: `git revert <the revert of AHEAD>`,
# `git rm -r -q results/paper/ch3.{settle,linear,dlin,outliers,limit,dnn}`, `git mv` each results-ahead/paper/ch3.*
# to results/paper/, then `python -m grokspectra status --profile paper` must say every experiment current. It will
# not if a function on chapter 3's call graph (dmft.run_dmft_factored, chi_kernel, spectral, hessian, multiindex, the
# ch3 experiments, params/paper.yaml's ch3 entries) changed on main in between: such a change restarts this sweep.
set -eu
cd "$(dirname "$0")/.."
AHEAD=${AHEAD:-66e7cb98ca}
TREE=${TREE:-../ahead-$AHEAD}
PY=${PY:-$PWD/.venv/bin/python}
[ -d "$TREE" ] || git worktree add -q --detach "$TREE" "$AHEAD"
export PY PYTHONPATH="$(cd "$TREE" && pwd)/src" GROKSPECTRA_STORE="$PWD/results-ahead" COMMIT_PATH=results-ahead/paper
if [ -n "${STATUS:-}" ]; then exec "$PY" -m grokspectra status --profile paper; fi
for target in ${*:-ch3.settle ch3.linear ch3.dlin ch3.outliers ch3.limit ch3.dnn}; do
  bash scripts/sweep_and_commit.sh "$target"
done
