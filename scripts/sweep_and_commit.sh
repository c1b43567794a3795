#!/usr/bin/env bash
# A long paper-profile sweep on the development machine, with its finished units committed as they land, so that a
# sweep cut short (the session ends, the machine goes away) loses at most the units in progress.
#
#   bash scripts/sweep_and_commit.sh ch3.dnn              # any target of `python -m grokspectra run`
#   EVERY=300 THREADS=2 bash scripts/sweep_and_commit.sh all
#
# Every EVERY seconds (default 600), and once more when the sweep ends, whatever is new under results/paper (or
# $COMMIT_PATH: scripts/compute_ahead.sh stores under results-ahead/paper) is committed on its own (nothing else is
# staged or committed). The store writes each unit atomically, and its
# interrupted writes (*.tmp) are ignored by git, so a commit never holds a half-written unit. Exit status: the
# sweep's.
set -u
cd "$(dirname "$0")/.."
TARGET=${1:?usage: bash scripts/sweep_and_commit.sh TARGET   (an experiment, a chapter or all)}
EVERY=${EVERY:-600}
PY=${PY:-.venv/bin/python}
LOG=${LOG:-build/sweep-$TARGET.log}
COMMIT_PATH=${COMMIT_PATH:-results/paper}
mkdir -p "$(dirname "$LOG")"
[ -n "${THREADS:-}" ] && export GROKSPECTRA_THREADS=$THREADS

commit_units() {
  [ -n "$(git status --porcelain -- "$COMMIT_PATH")" ] || return 0
  git add -- "$COMMIT_PATH" \
    && git commit -q -m "$COMMIT_PATH: more units of $TARGET (the sweep resumes from here)" -- "$COMMIT_PATH" \
    && echo "$(date -u +%H:%M:%S) committed units of $TARGET"
}

"$PY" -m grokspectra run "$TARGET" --profile paper > "$LOG" 2>&1 &
pid=$!
# Stopping it (Ctrl-C, or `kill <this script's pid>`) stops the sweep with SIGTERM, not SIGINT: a sweep started in
# the background (`nohup … &`) ignores SIGINT, as background jobs do. The store's atomic writes and the units'
# checkpoints make TERM safe (at most the DMFT point in progress is lost); the units so far are then committed.
trap 'kill -TERM $pid 2>/dev/null' INT TERM
echo "sweep of $TARGET: pid $pid, log $LOG, committing every $EVERY s"
while kill -0 "$pid" 2>/dev/null; do
  for _ in $(seq "$EVERY"); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  commit_units
done
wait "$pid"
rc=$?
commit_units
echo "sweep of $TARGET ended with status $rc (log $LOG)"
exit "$rc"
