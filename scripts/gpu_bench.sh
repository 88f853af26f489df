#!/usr/bin/env bash
# Issue 40's measurements in one command: on an H100 (or any CUDA GPU), SmolLM2-135M-Instruct in bf16 with its EAGLE
# head (pair "smollm2-135m"), the pair's forwards captured as CUDA graphs (--decoding graphs).
#
#   identity   greedy identity: every strategy (fixed, adaptive, lookup, eagle, tree) against the project's own
#              target-only, 8 held-out prompts x 64 tokens; "identity N/8" per strategy (bench --identity), and the
#              captured target-only against the eager one
#   t0, t07    bench --strategies at T = 0 and T = 0.7, 10 held-out prompts x 128 tokens (and the 4 copy prompts),
#              --decoding graphs --no-k-search --no-hf: the captured target-only (bf16 and float32) beside every
#              strategy; the capture seconds of each pair load are printed; where graphs are captured on first
#              use, every row runs once on every prompt before the timing, which then captures nothing (the count
#              and seconds of both are printed: 'graphs captured on first use')
#   window     scripts/experiments/window_cost.py: a target step through the whole window's cache against the
#              request's, with and without the cache-length buckets, and whole target-only runs of the bench's
#              prompts through the pair as the app loads it against request-sized caches (issue 45's first floor)
#   rounds     python -m specdemo.bench.round_ops: operators launched outside the graphs, host reads and CUDA's
#              syncs, per eagle and tree round (issue 45's floor: at most 40 and 1), and the lines that synced
#   cuda-tests python -m pytest -m cuda -q over the test files that hold a `cuda` test (the others import gradio,
#              which the GPU machine lacks)
#   load       one load of the pair as the app loads it (auto: graphs on CUDA, caches of the whole context window):
#              load and capture seconds
#   fused      bench --strategies --decodings graphs,compiled at T = 0 on 3 prompts (and the 4 copy prompts) x 128
#              tokens: every row with the target's forward captured plain and compiled by torch.compile first
#              (SPECDEMO_DECODING=compiled; issue 45's fused forwards), the compile seconds in the decoding line
#   compiled   bench --strategies --compiled at T = 0 on 2 prompts (and the 4 copy prompts) x 128 tokens:
#              transformers' generate with its static cache under torch.compile, in a process of its own, warmed on
#              each prompt length (compile seconds printed apart), beside the captured rows; last, since each new
#              prompt length may compile again (47 s the first time on the H200)
#
# Every step has its own timeout, and all of them together --budget seconds (the GPU machine stops a command at 600
# s); a failed step does not stop the others. Logs go to the results folder ($OUT if set, else ./gpu-results; --out
# DIR), one per step (a bench's JSON beside its log), and a summary table ends the run (summary.txt).
#
#   bash .gpu/run.sh run bash scripts/gpu_bench.sh                          # on the GPU machine (shared/gpu/README.md)
#   PYTHON=.venv/bin/python bash scripts/gpu_bench.sh --device cpu --quick   # a dry run on a CPU
#
# Options: --device cuda|cpu (cpu: a dry run, with 4x the timeouts; graphs run as static there, and the compiled row
# is dry-run on the Shakespeare pair in a step of its own, since compiling SmolLM2 on a small CPU takes minutes),
# --quick (2 prompts x 16 tokens), --steps a,b,... (a subset, in the order above; `floors` = t0,t07,rounds,cuda-tests,
# issue 45's GPU floors, `more` = identity,window,load,fused, and `next` = window,cuda-tests,load,fused: the whole
# run no longer fits one 600-s call, and a session's 15 minutes of device time may not hold two), --out DIR, --budget
# SECONDS (default 570 on cuda, 2400 on cpu). $PYTHON: the interpreter (default python3).
set -u
cd "$(dirname "$(readlink -f "$0")")/.." || exit 2

PY=${PYTHON:-python3}
DEVICE=cuda
QUICK=0
STEPS="identity,t0,t07,window,rounds,cuda-tests,load,fused,compiled"
RESULTS=${OUT:-./gpu-results}
BUDGET=
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --steps) STEPS=$2; shift 2 ;;
    --out) RESULTS=$2; shift 2 ;;
    --budget) BUDGET=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -u$/{/^set -u$/!p}' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)"; exit 2 ;;
  esac
done
case "$STEPS" in
  floors) STEPS="t0,t07,rounds,cuda-tests" ;;
  more) STEPS="identity,window,load,fused" ;;
  next) STEPS="window,cuda-tests,load,fused" ;;  # what the H200 run of 2026-11-28 left unmeasured or unrerun
esac
mkdir -p "$RESULTS" || exit 2
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=${HF_HUB_OFFLINE:-1} TOKENIZERS_PARALLELISM=false

PAIR=smollm2-135m
if [ "$QUICK" = 1 ]; then
  ID_PROMPTS=2; ID_TOKENS=16; B_PROMPTS=2; B_TOKENS=16
else
  ID_PROMPTS=8; ID_TOKENS=64; B_PROMPTS=10; B_TOKENS=128
fi
# per-step timeouts in seconds (4x on a CPU); each is also cut to what is left of the budget
declare -A LIMIT=([identity]=150 [t0]=240 [t07]=240 [window]=150 [rounds]=90 [cuda-tests]=180 [load]=90 [fused]=240
                  [compiled]=300 [compiled-cpu]=150)
BENCH=(-m specdemo bench --pair "$PAIR" --device "$DEVICE" --strategies --decoding graphs --no-k-search --no-hf
       --prompts "$B_PROMPTS" --max-new-tokens "$B_TOKENS")
if [ "$DEVICE" = cpu ]; then
  for k in "${!LIMIT[@]}"; do LIMIT[$k]=$(( LIMIT[$k] * 4 )); done
  BUDGET=${BUDGET:-2400}
  # SmolLM2's compile on a 2-core CPU takes minutes: the compiled-cpu step dry-runs the row on Shakespeare instead
  STEPS=${STEPS/compiled/compiled-cpu}
fi
BUDGET=${BUDGET:-570}
W_ARGS=(--passes 3 --runs "$B_PROMPTS" --tokens "$B_TOKENS")
[ "$QUICK" = 1 ] && W_ARGS=(--passes 1 --reps 3 --contexts 64,290 --runs 1 --tokens "$B_TOKENS")

START=$(date +%s)
declare -a NAMES STATUS SECS
log() { echo "[gpu_bench $(date +%T)] $*" | tee -a "$RESULTS/summary.txt"; }

# run NAME CMD...: one step under its timeout (cut to the budget left); stdout to NAME.out, stderr to NAME.log (a
# stdout that is no JSON is added to the log too)
run() {
  local name=$1; shift
  local left=$(( BUDGET - ($(date +%s) - START) ))
  local limit=${LIMIT[$name]:-120}
  [ "$left" -lt "$limit" ] && limit=$left
  NAMES+=("$name")
  if [ "$limit" -lt 20 ]; then
    STATUS+=("skipped: budget spent"); SECS+=(0); log "$name: skipped, ${left}s of the budget left"; return
  fi
  log "$name (timeout ${limit}s): $*"
  local t0
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" > "$RESULTS/$name.out" 2> "$RESULTS/$name.log"
  local rc=$?
  [ "$(head -c 1 "$RESULTS/$name.out")" = "{" ] || cat "$RESULTS/$name.out" >> "$RESULTS/$name.log"
  SECS+=("$(( $(date +%s) - t0 ))")
  case $rc in
    0) STATUS+=("ok") ;;
    124|137) STATUS+=("TIMEOUT after ${limit}s") ;;
    *) STATUS+=("FAILED rc=$rc") ;;
  esac
  log "$name: ${STATUS[-1]} in ${SECS[-1]}s"
}

want() { [[ ",$STEPS," == *",$1,"* ]]; }

# render KIND NAME: the table of a --json bench's output (NAME.out) appended to its log
render() {
  [ -s "$RESULTS/$2.out" ] || return
  "$PY" - "$1" "$RESULTS/$2.out" >> "$RESULTS/$2.log" 2>&1 <<'EOF'
import json, sys
kind, path = sys.argv[1], sys.argv[2]
res = json.load(open(path))
if kind == "identity":
    from specdemo.bench.identity import format_identity
    print(format_identity(res))
else:
    from specdemo.bench.strategies_table import format_strategies
    print(format_strategies(res))
EOF
}

{
  echo "# gpu_bench $(date -u +%FT%TZ) device=$DEVICE quick=$QUICK steps=$STEPS python=$PY"
  git rev-parse HEAD 2>/dev/null || echo "commit unknown"
  command -v nvidia-smi >/dev/null && nvidia-smi -L
  "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), \
'transformers', transformers.__version__, 'threads', torch.get_num_threads())"
  lscpu 2>/dev/null | grep -m1 "Model name"
} > "$RESULTS/summary.txt" 2>&1
cat "$RESULTS/summary.txt"

if want identity; then
  run identity "$PY" -m specdemo bench --pair "$PAIR" --device "$DEVICE" --identity --decoding graphs \
    --prompts "$ID_PROMPTS" --max-new-tokens "$ID_TOKENS" --json
  render identity identity
fi
if want t0; then
  run t0 "$PY" "${BENCH[@]}" --temperature 0 --json
  render strategies t0
fi
if want t07; then
  run t07 "$PY" "${BENCH[@]}" --temperature 0.7 --json
  render strategies t07
fi
if want window; then
  run window "$PY" scripts/experiments/window_cost.py --pair "$PAIR" --device "$DEVICE" "${W_ARGS[@]}"
fi
if want rounds; then
  run rounds "$PY" -m specdemo.bench.round_ops --pair "$PAIR" --device "$DEVICE"
fi
if want compiled-cpu; then
  echo "compiled-cpu: the compiled row on a CPU is dry-run with the Shakespeare pair: compiling SmolLM2 takes minutes" \
    | tee -a "$RESULTS/summary.txt"
  run compiled-cpu "$PY" -m specdemo bench --pair shakespeare --device cpu --strategies --decoding graphs --compiled \
    --no-k-search --no-hf --prompts 1 --max-new-tokens 16 --json
  render strategies compiled-cpu
fi
if want cuda-tests; then
  if "$PY" -c "import pytest, xdist" 2>/dev/null; then
    mapfile -t CUDA_FILES < <(grep -l "mark.cuda" tests/test_*.py)
    run cuda-tests "$PY" -m pytest -m cuda -q -p no:cacheprovider "${CUDA_FILES[@]}"
  else
    run cuda-tests "$PY" -c "import pytest, xdist"  # fails, and the log says which is missing (pytest.ini needs xdist)
  fi
fi

if want load; then
  run load "$PY" - "$PAIR" "$DEVICE" <<'EOF'
import sys, time
t0 = time.perf_counter()
from specdemo.models import load_pair
pair = load_pair(sys.argv[1], device=sys.argv[2])
took = time.perf_counter() - t0
capture = {role: round(slot.capture_s, 2) for role, slot in pair.static_slots.items()}
sizes = {role: slot.max_len for role, slot in pair.static_slots.items()}
graphs = {role: len(slot.graphs) for role, slot in pair.static_slots.items()}
print(f"load: {took:.1f} s for {pair.name} on {pair.device} ({pair.describe()['dtype']}); decoding {pair.decoding}: "
      f"{pair.decoding_note}; capture seconds {capture}, graphs {graphs} (static caches of {sizes} tokens, the "
      f"whole context window)")
EOF
fi

if want fused; then
  run fused "$PY" -m specdemo bench --pair "$PAIR" --device "$DEVICE" --strategies --decodings graphs,compiled \
    --no-k-search --no-hf --prompts 3 --max-new-tokens "$B_TOKENS" --temperature 0 --json
  render strategies fused
fi

if want compiled; then
  run compiled "$PY" -m specdemo bench --pair "$PAIR" --device "$DEVICE" --strategies --decoding graphs --compiled \
    --no-k-search --no-hf --prompts 2 --max-new-tokens "$B_TOKENS" --temperature 0 --json
  render strategies compiled
fi

# ------------------------------------------------------------------------------------------------ the summary
{
  echo
  echo "## summary ($(( $(date +%s) - START )) s; logs in $RESULTS)"
  echo
  echo "| step | status | seconds |"
  echo "|---|---|---:|"
  for i in "${!NAMES[@]}"; do echo "| ${NAMES[$i]} | ${STATUS[$i]} | ${SECS[$i]} |"; done
  echo
  for f in identity t0 t07 fused compiled compiled-cpu; do
    [ -f "$RESULTS/$f.log" ] || continue
    echo; echo "### $f"
    grep -hE "^decoding |^graphs captured|identity [0-9]+/|^hf generate static compiled|^greedy identity|^pair " \
      "$RESULTS/$f.log" \
      | awk '!seen[$0]++'
    # the general prompts' table (the first table of a strategies log)
    awk '/^general prompts/{on=1} /^copy prompts/{on=0} on' "$RESULTS/$f.log"
    awk '/^copy prompts/{on=1} on && /^uneven:/ {print "copy prompts, " $0}' "$RESULTS/$f.log"  # a slow prompt there
    [ -s "$RESULTS/$f.out" ] || tail -n 3 "$RESULTS/$f.log"  # no result: how it ended
  done
  for f in window rounds; do
    if [ -f "$RESULTS/$f.log" ]; then
      echo; echo "### $f"; grep -h "^|\|^smollm2\|on cuda\|on cpu\|^lines that\|^whole runs" "$RESULTS/$f.log"
    fi
  done
  if [ -f "$RESULTS/cuda-tests.log" ]; then echo; echo "### cuda-tests"; tail -n 3 "$RESULTS/cuda-tests.log"; fi
  if [ -f "$RESULTS/load.log" ]; then
    echo; echo "### load"; grep -h "^load:" "$RESULTS/load.log" || tail -n 3 "$RESULTS/load.log"
  fi
} | tee -a "$RESULTS/summary.txt"

for s in "${STATUS[@]}"; do [ "$s" = ok ] || exit 1; done
exit 0
