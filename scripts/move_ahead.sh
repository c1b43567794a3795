#!/usr/bin/env bash
# The move of chapters to a code change once scripts/compute_ahead.sh has computed their paper profiles (README, "The
# DMFT engine, and how a chapter moves to new code"). In one commit: the revert of the change is reverted, and every
# experiment found in results-ahead/paper replaces its results in results/paper. Then `status --profile paper` must
# report every experiment current, or nothing is committed. Edits to the change made after its revert (a test, the
# chapter's prose) wait in scripts/move_ahead.d/*.patch, diffs against the change's tree, applied in the same commit.
#
#   bash scripts/move_ahead.sh            # the move, checked, then committed
#   CHECK_ONLY=1 bash scripts/move_ahead.sh   # the move in the working tree and the status check; nothing committed,
#                                             # the tree restored (a rehearsal before results-ahead is complete)
#   IN_CLONE=1 PY=/work/main/.venv/bin/python CHECK_ONLY=1 bash scripts/move_ahead.sh   # the rehearsal in a clone,
#                                             # beside the sweep running in the main checkout
# Refused while a ch3.dnn cell breaks down with the change where main's results bisected it
# (scripts/dnn_breakdowns.py; on 7 December 11 of 30 did, from a bound in the engine that was too tight).
#
#   PARTIAL=ch3.dnn bash scripts/move_ahead.sh   # move while that experiment is still partial (every stored unit
#                                             # current, some missing): its checkpoints move too, and
#                                             # `bash scripts/sweep_and_commit.sh ch3.dnn` then finishes it in
#                                             # results/paper with main's code, resuming the unit in progress
set -eu
cd "$(dirname "$0")/.."
REVERT=${REVERT:-6d65c9b}   # the commit that reverted the change (3533e87: 96f859d..22359f7 again; d494280: the bisection rule)
PY=${PY:-$PWD/.venv/bin/python}
export PYTHONPATH="$PWD/src"
[ -z "$(git status --porcelain --untracked-files=no)" ] || { echo "move_ahead: the working tree has changes; commit or stash them first" >&2; exit 2; }
if [ -z "${IN_CLONE:-}" ] && pgrep -f "compute_ahead.sh|grokspectra run" > /dev/null; then
  echo "move_ahead: a sweep is still running; stop it first" >&2; exit 2
fi
# the experiments with stored units there (a sweep just started leaves an empty directory)
EXPS=$(cd results-ahead/paper 2>/dev/null && for d in */; do [ -n "$(git ls-files "$d" | head -1)" ] && echo "${d%/}"; done || true)
[ -n "$EXPS" ] || { echo "move_ahead: nothing in results-ahead/paper" >&2; exit 1; }
echo "== how far the change moved each result (scripts/compare_results.py; read it before the move)"
"$PY" scripts/compare_results.py results-ahead/paper results/paper
if [ -d results-ahead/paper/ch3.dnn ] && [ -d results/paper/ch3.dnn ] && [ -z "${ALLOW_BREAKDOWNS:-}" ]; then
  "$PY" scripts/dnn_breakdowns.py results-ahead/paper results/paper || {
    echo "move_ahead: δ_NN cells break down with the change where main's code bisected them; explain that first" \
         "(ALLOW_BREAKDOWNS=1 moves anyway)" >&2; exit 1; }
fi
start=$(git rev-parse HEAD)
restore() { git reset -q --hard "$start"; }
trap 'echo "move_ahead: failed; the tree is restored" >&2; restore' ERR
# where main edited lines the change also edits (the README's account of the move), the change's version wins
git revert --no-commit -X theirs "$REVERT"
# edits to the change that came after its revert (tests, prose; never code a result depends on): patches against it
for p in scripts/move_ahead.d/*.patch; do
  [ -e "$p" ] || continue
  git apply --index "$p"
done
git rm -r -q --ignore-unmatch scripts/move_ahead.d
for e in $EXPS; do
  if [ -d "results/paper/$e" ]; then git rm -r -q "results/paper/$e"; rm -rf "results/paper/$e"; fi
  mkdir -p results/paper
  git mv "results-ahead/paper/$e" "results/paper/$e"
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
  trap - ERR; restore
  exit 1
fi
if [ -n "${CHECK_ONLY:-}" ]; then echo "move_ahead: CHECK_ONLY, every experiment current; the tree is restored"; trap - ERR; restore; exit 0; fi
git commit -q -m "The DMFT engine change moves to main: its revert ($REVERT) reverted, the paper profiles computed with it moved from results-ahead/paper to results/paper ($(echo $EXPS | wc -w) experiments)${PARTIAL:+; $PARTIAL still partial: its sweep finishes it there}"
echo "move_ahead: committed $(git rev-parse --short HEAD)"
