#!/usr/bin/env bash
# The GPU rows of docs/cost.md in two device calls (written for a lent H200: 15 minutes of device time in all, 10 a
# command): `python benchmarks/cost_report.py --device cuda`, a part at a time, each under its own time limit so that
# a slow part costs only itself (the results file is written after each part). Not run yet: no GPU has been lent
# since it was written.
#
#   run(command="bash benchmarks/gpu/gpu_cost.sh speed memory", timeout_s=330)   # the `device` tool, from the repo root
#   run(command="bash benchmarks/gpu/gpu_cost.sh length decode", timeout_s=400)  # the next call, while it is warm
#
# (Two calls: the four parts' limits add up to more than one command may run. With no parts named, all four.) Between
# the calls, copy the first call's cost_report_cuda.json into benchmarks/results/ here: it travels with the working
# tree, so the second call adds its parts to the first's.
# Nothing to install: the device image's torch and transformers (5.17 there) are inside pyproject.toml's range, and
# the models are random-weight configs. Back in $OUT: cost_report_cuda.json, cost.md (rendered with the CPU tables)
# and cost_gpu.log; copy the JSON into benchmarks/results/ and run `python benchmarks/cost_report.py --render-only`.
# SMOKE=1 runs the same orchestration on a CPU (one method, one round; the results files are restored afterwards):
# it checks this script, not the numbers.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/gpu_out}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
RESULT=benchmarks/results/cost_report_cuda.json
if [ "${SMOKE:-0}" = 1 ]; then
  RESULT=benchmarks/results/cost_report_cpu.json
  KEEP=$(mktemp -d); cp "$RESULT" docs/cost.md "$KEEP/"
  ARGS=(--device cpu --methods rmt --rounds 1)
  LENGTH=(--lengths 1024 2048); DECODE=(--decode-setup llama4 64 1)
else
  ARGS=(--device cuda --rounds 3)
  LENGTH=()  # 8k, 32k, 128k tokens
  DECODE=(--decode-setup smollm2 128 1 8)  # 128 new tokens a run: the setup's 512 would not fit
fi
PARTS=("$@"); [ ${#PARTS[@]} = 0 ] && PARTS=(speed memory length decode)
T0=$(date +%s)
part() {  # part SECONDS ARGS...: one part of the report, stopped at its limit
  local limit=$1; shift
  echo "[$(( $(date +%s) - T0 ))s] cost_report $* (limit ${limit}s)"
  timeout "$limit" "$PY" benchmarks/cost_report.py "${ARGS[@]}" "$@" 2>&1 | grep -v -i warn | tail -n 5
  echo "  exit ${PIPESTATUS[0]}"
}
{
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv 2>&1 | tail -n 1
  "$PY" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  for name in "${PARTS[@]}"; do
    case $name in
      speed) part 270 --parts speed ;;  # the acceptance's rows: speed x FLOPs, both models
      memory) part 50 --parts memory ;;
      length) part 90 --parts length "${LENGTH[@]}" ;;
      decode) part 290 --parts decode "${DECODE[@]}" ;;  # batch 1 and 8; the decode FLOPs are counted on eager copies
      *) echo "unknown part $name: speed, memory, length or decode"; exit 2 ;;
    esac
  done
  echo "[$(( $(date +%s) - T0 ))s] done"
} 2>&1 | tee -a "$OUT/cost_gpu.log"
cp -f "$RESULT" "$OUT/" 2>/dev/null
cp -f docs/cost.md "$OUT/"
if [ "${SMOKE:-0}" = 1 ]; then
  cp -f "$KEEP"/cost_report_cpu.json "$RESULT"; cp -f "$KEEP"/cost.md docs/cost.md; rm -rf "$KEEP"
fi
ls -la "$OUT"
