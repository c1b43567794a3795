#!/usr/bin/env bash
# Paper profiles computed ahead of a code change, so that the chapters it touches move to it without ever showing
# CI-scale results in between (README, "The DMFT engine, and how a chapter moves to new code").
#
# A commit range on main makes the change, ending at AHEAD; the commit after it reverts the range until the results
# exist. This script runs the sweeps with AHEAD's code (a detached worktree, TREE) into results-ahead/paper, and
# commits each finished batch of units on main as it lands; the units' records name AHEAD's commit. Resumable: run it
# again in a later session, and it goes on where the last one stopped.
#
#   bash scripts/compute_ahead.sh                    # every experiment whose code version AHEAD changes, in
#                                                    #   chapter order, the long ones (LAST) at the end
#   bash scripts/compute_ahead.sh ch3.dnn            # one of them
#   CHANGED=1 bash scripts/compute_ahead.sh          # the experiments whose code version differs from main's
#   STATUS=1 bash scripts/compute_ahead.sh           # how far it is (`status` of that store, AHEAD's code)
#
# The move, when STATUS says them current, is `bash scripts/move_ahead.sh` (it reverts the revert and moves every
# experiment found in results-ahead/paper to results/paper). Until then, a change on main to the call graph of one of
# these experiments restarts its sweep: main's results would no longer be current with AHEAD's code after the move.
set -eu
cd "$(dirname "$0")/.."
AHEAD=${AHEAD:-d494280}  # 96f859d..22359f7 reapplied in 3533e87, and the bisection rule (d494280)
TREE=${TREE:-../ahead-$AHEAD}
PY=${PY:-$PWD/.venv/bin/python}
[ -d "$TREE" ] || git worktree add -q --detach "$TREE" "$AHEAD"
TREE=$(cd "$TREE" && pwd)
codes() {  # name code-version, one line per experiment, for the tree $1
  PYTHONPATH="$1/src" OMP_NUM_THREADS=1 "$PY" -c 'from grokspectra import experiments as ex
ex.load_chapters()
for n, e in sorted(ex.REGISTRY.items()): print(n, e.code())'
}
changed() {
  join <(codes "$TREE") <(codes "$PWD") -a 1 | awk 'NF == 2 || $2 != $3 {print $1}'
}
if [ -n "${CHANGED:-}" ]; then changed; exit 0; fi
export PY PYTHONPATH="$TREE/src" GROKSPECTRA_STORE="$PWD/results-ahead" COMMIT_PATH=results-ahead/paper
# the change's compiled kernels build apart from main's (both are named grokspectra_chi_kernel; one build directory
# would be rebuilt back and forth, and a process could load the other's library mid-build)
export TORCH_EXTENSIONS_DIR=${AHEAD_EXTENSIONS_DIR:-$TREE/.torch_extensions}
if [ -n "${STATUS:-}" ]; then exec "$PY" -m grokspectra status --profile paper; fi
LAST=${LAST:-ch3.dnn}  # the longest sweeps, after every other (their units take minutes to hours each)
if [ $# -gt 0 ]; then targets="$*"; else
  all=$(changed | sort -V)  # the two trees' code versions, read once
  targets="$(grep -vxF -f <(tr ' ' '\n' <<< "$LAST") <<< "$all") $(grep -xF -f <(tr ' ' '\n' <<< "$LAST") <<< "$all")"
fi
for target in $targets; do
  bash scripts/sweep_and_commit.sh "$target"
done
