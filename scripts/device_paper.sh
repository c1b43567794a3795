#!/usr/bin/env bash
# One prepared run on a borrowed GPU machine: compute what is still missing of the paper profile, in the order the
# book needs it, within a time budget, then pack the store so the results can be brought back and committed.
#
#   BUDGET=480 OUT=/some/dir bash scripts/device_paper.sh        # needs only torch + this checkout (no Jupyter)
#   ORDER=ch3.dnn BENCH="dmft modadd" GROKSPECTRA_COMMIT=<sha> ...  # one experiment, benchmarks first; the commit
#                                                                  # for provenance where the copy has no .git
#   SRC=build/ahead/src GROKSPECTRA_STORE=results-ahead GROKSPECTRA_COMMIT=<AHEAD> ORDER=ch3.dnn ...
#       # a change computed ahead (scripts/compute_ahead.sh): its code, exported here before the run with
#       # `git archive <AHEAD> src params | tar -x -C build/ahead` (carry build/ahead), and
#       # its store; bring back $OUT/results-paper-new.tar.gz and unpack it in results-ahead
#
# Finished units are stored one by one (results/paper/...), so stopping at the budget loses at most the unit in
# progress; a later run (here or on a CPU) computes only what is still missing.
set -u
PYTHON=${PYTHON:-python}
cd "$(dirname "$0")/.."
BUDGET=${BUDGET:-480}                  # seconds of computing, start-up and packing not included
OUT=${OUT:-$PWD/build}
ORDER=${ORDER:-"ch6 ch7.headline ch7.eta_long ch7.eta_sweep ch7.relu ch7.grid ch1 ch2 ch4.sweep ch3 ch4 ch5"}
SRC=${SRC:-$PWD/src}                   # the code that runs (a change computed ahead: its exported src)
STORE_ROOT=${GROKSPECTRA_STORE:-results}
export PYTHONPATH="$SRC${PYTHONPATH:+:$PYTHONPATH}" GROKSPECTRA_PROGRESS=0
DEVICE=${DEVICE:-cuda}
BENCH=${BENCH:-}                       # benchmarks to time first, e.g. "dmft modadd" (BENCH_CAP seconds each)
BENCH_CAP=${BENCH_CAP:-60}
mkdir -p "$OUT"
marker=$(mktemp); touch "$marker"
nvidia-smi -L 2>/dev/null || true
"$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
for b in $BENCH; do
  echo "== $(date -u +%H:%M:%S) bench $b"
  timeout -s INT -k 10 "$BENCH_CAP" "$PYTHON" -m grokspectra bench "$b" --device "$DEVICE" > "$OUT/bench-$b.json" \
    || echo "bench $b stopped or failed (exit $?)"
done
"$PYTHON" -m grokspectra status --profile paper
start=$(date +%s)
for e in $ORDER; do
  left=$(( BUDGET - ($(date +%s) - start) ))
  if [ "$left" -lt 20 ]; then echo "budget spent before $e"; break; fi
  echo "== $(date -u +%H:%M:%S) $e (${left} s left)"
  timeout -s INT -k 15 "$left" "$PYTHON" -m grokspectra run "$e" --profile paper --device "$DEVICE" \
    || echo "stopped or failed: $e (exit $?)"
done
"$PYTHON" -m grokspectra status --profile paper
"$PYTHON" -m grokspectra pack "$OUT/results-paper.tar.gz" --profile paper
# what this run added alone (units and bisection checkpoints), small enough to bring back when the whole store is not
(cd "$STORE_ROOT" && find paper -newer "$marker" -type f ! -name '*.tmp' -print0) \
  | tar czf "$OUT/results-paper-new.tar.gz" -C "$STORE_ROOT" --null -T -
tar tzf "$OUT/results-paper-new.tar.gz" | sed 's/^/new: /'
