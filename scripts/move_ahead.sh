#!/usr/bin/env bash
# Chapter 3's move to the factored DMFT engine, once scripts/compute_ahead.sh has computed its paper profile
# (README, "Chapter 3's move to the factored DMFT engine"). In one commit: the revert of the engine switch is
# reverted, the run_dmft results of the six experiments that run the DMFT leave results/paper, and results-ahead's
# take their place. Then `status --profile paper` must report every experiment current, or nothing is committed.
#
#   bash scripts/move_ahead.sh            # the move, checked, then committed
#   CHECK_ONLY=1 bash scripts/move_ahead.sh   # the move in the working tree and the status check; nothing committed,
#                                             # the tree restored (a rehearsal before results-ahead is complete)
#   IN_CLONE=1 PY=/work/main/.venv/bin/python CHECK_ONLY=1 bash scripts/move_ahead.sh   # the rehearsal in a clone,
#                                             # beside the sweep running in the main checkout
#   PARTIAL=ch3.dnn bash scripts/move_ahead.sh   # move while that experiment is still partial (every stored unit
#                                             # current, some missing): its checkpoints move too, and
#                                             # `bash scripts/sweep_and_commit.sh ch3.dnn` then finishes it in
#                                             # results/paper with main's code, resuming the cell in progress
set -eu
cd "$(dirname "$0")/.."
REVERT=${REVERT:-c280f3b}   # the commit that reverted the switch (commit 66e7cb98ca)
PY=${PY:-$PWD/.venv/bin/python}
export PYTHONPATH="$PWD/src"
EXPS="settle linear dlin outliers limit dnn"
[ -z "$(git status --porcelain --untracked-files=no)" ] || { echo "move_ahead: the working tree has changes; commit or stash them first" >&2; exit 2; }
if [ -z "${IN_CLONE:-}" ] && pgrep -f "compute_ahead.sh|grokspectra run ch3" > /dev/null; then
  echo "move_ahead: a ch3 sweep is still running; stop it first" >&2; exit 2
fi
start=$(git rev-parse HEAD)
restore() { git reset -q --hard "$start"; }
git revert --no-commit "$REVERT"
for e in $EXPS; do
  [ -d "results-ahead/paper/ch3.$e" ] || { echo "move_ahead: results-ahead/paper/ch3.$e is missing" >&2; restore; exit 1; }
  git rm -r -q "results/paper/ch3.$e"
  rm -rf "results/paper/ch3.$e"
  git mv "results-ahead/paper/ch3.$e" "results/paper/ch3.$e"
done
if [ -n "${PARTIAL:-}" ] && [ -d "results-ahead/paper/.checkpoints/$PARTIAL" ]; then
  mkdir -p results/paper/.checkpoints
  git mv "results-ahead/paper/.checkpoints/$PARTIAL" "results/paper/.checkpoints/$PARTIAL"
fi
git rm -r -q --ignore-unmatch results-ahead/paper/.checkpoints
status=$("$PY" -m grokspectra status --profile paper)
echo "$status"
bad=$(echo "$status" | awk -v partial="${PARTIAL:-}" '$2 ~ /^[0-9]+\/[0-9]+$/ && $3 != "current" && !($1 == partial && $3 == "partial")')
if [ -n "$bad" ]; then
  echo "move_ahead: not every experiment is current after the move:" >&2
  echo "$bad" >&2
  restore
  exit 1
fi
if [ -n "${CHECK_ONLY:-}" ]; then echo "move_ahead: CHECK_ONLY, every experiment current; the tree is restored"; restore; exit 0; fi
git commit -q -m "ch3 moves to the factored DMFT engine: the revert of 66e7cb98ca reverted, its paper profile moved from results-ahead/paper to results/paper${PARTIAL:+ ($PARTIAL still partial: its sweep finishes it there)}"
echo "move_ahead: committed $(git rev-parse --short HEAD)"
