#!/usr/bin/env bash
# The trained-memory recipe that learned on the CPU (docs/trained_memory.md, "The recipe": ARMT, memory only,
# SmolLM2-135M, segments of 128 tokens, batch 4, lr 3e-4), on a lent GPU, continued past the CPU's 8 segments to 16
# and 32, and evaluated to 1,024 segments (128k tokens), 25 prompts per length, with memory disabled on the same
# prompts. It trains from scratch: the CPU run's checkpoint (84 MB in float32) does not fit into what a call carries,
# and the whole CPU curriculum (79 CPU-minutes) is a few minutes on a GPU.
#
#   bash benchmarks/gpu/carry.sh                                        # here: .cache/gpu1, .cache/gpu2, ...
#   run(command="bash benchmarks/gpu/gpu_trained_memory.sh", carry=[".cache/gpu1"], timeout_s=120)
#   run(command="bash benchmarks/gpu/gpu_trained_memory.sh", carry=[".cache/gpu2"], timeout_s=120)  # at once: a
#   run(command="bash benchmarks/gpu/gpu_trained_memory.sh", carry=[".cache/gpu3"], timeout_s=600)  # machine stays
#                                                                                                     # warm 30 s
# The same command each call: it keeps what the call carried (benchmarks/gpu/stash.sh) and, once SmolLM2 is complete,
# trains (TRAIN_MINUTES, default 4.5) and evaluates until DEADLINE seconds into the call (default 540); each
# evaluated length is written as it finishes. Back in $OUT: trained_memory_gpu.jsonl (the run's per-sample lines:
# append them to benchmarks/results/trained_memory.jsonl here, then `python benchmarks/render_docs.py`),
# report.json, curves.png, train.log; infllm_gpu.jsonl and reader.log (the reader beside it, below: append the
# records to benchmarks/results/infllm.jsonl). Set HMT_ADAPTERS_COMMIT=<sha> in the command: the device copy has no .git.
# SMOKE=1 runs the same on this CPU at toy size (two steps, two prompts at 2 segments), wheels not needed.
set -uo pipefail
cd "$(dirname "$0")/../.."
W=${GPU_STATE:-/root/gpu}
OUT=${OUT:-runs/gpu_out}
PY=${PYTHON:-python3}
RUN=armt-smollm2-gpu
mkdir -p "$W/runs" "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
T0=$(date +%s)
if [ "${SMOKE:-0}" = 1 ]; then
  SIZE=(--levels 2 --eval-segments 2 --eval-samples 2 --eval-size 2 --max-steps 2 --threads 1)
  DEADLINE=${DEADLINE:-300}
else
  # shellcheck source=benchmarks/gpu/stash.sh
  source benchmarks/gpu/stash.sh
  stash; status=$?
  [ $status = 3 ] && exit 0  # parts still to come
  [ $status = 0 ] || exit $status
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  SIZE=(--levels 2 4 8 16 32 --eval-segments 128 256 1024 --eval-samples 25 --eval-size 32
        --max-minutes "${TRAIN_MINUTES:-4.5}")
  DEADLINE=${DEADLINE:-540}
fi
# Beside the training (READER=0: not), the default training-free reader at 128k in bf16, 25 prompts, under its own
# name (`infllm-bf16`: the CPU's float32 cells stay apart); its seconds share the GPU with the training, so they are
# no clean timings (docs/cost.md's rows are gpu_cost.sh's, alone on the device).
if [ "${READER:-1}" = 1 ]; then
  cp benchmarks/results/infllm.jsonl "$W/infllm.jsonl"
  if [ "${SMOKE:-0}" = 1 ]; then READ=(--device cpu --lengths 1k --samples 1 --threads 1); else
    READ=(--device cuda --dtype bfloat16 --lengths 128k --samples 25); fi
  timeout $((DEADLINE - 20)) "$PY" benchmarks/infllm.py --readers infllm --reader-name infllm-bf16 \
    --tasks passkey_standard "${READ[@]}" --update --out "$W/infllm.jsonl" >"$W/reader.log" 2>&1 &
  READER_PID=$!
fi
# the CPU recipe's command (docs/trained_memory.md), only the levels and evaluated lengths extended
timeout $((DEADLINE - ($(date +%s) - T0))) "$PY" examples/train_longcontext.py --model smollm2 --method armt \
  --segment-length 128 --batch-size 4 --lr 3e-4 --warmup-steps 0 --advance-at 0.9 --eval-every 25 \
  --output "$W/runs/$RUN" --resume "${SIZE[@]}" >"$W/train.log" 2>&1
rc=$?
echo "[$(( $(date +%s) - T0 ))s] train_longcontext exit $rc (124: stopped at the deadline; what it evaluated is kept)"
tr '\r' '\n' <"$W/train.log" | grep -E '^ *[0-9]+ segments \(' | tail -n 12  # the evaluated lengths
# the run's lines only, so that appending them here keeps the rows collected since this copy was made
"$PY" - "$W/runs/$RUN" "$OUT/trained_memory_gpu.jsonl" <<'EOF'
import json, sys
from pathlib import Path
sys.path.insert(0, "benchmarks")
from trained_memory import rows_of
report = Path(sys.argv[1]) / "report.json"
rows = rows_of(Path(sys.argv[1])) if report.exists() else []
for h in json.loads(report.read_text())["history"] if rows else []:  # the curriculum: step, stage, exact, loss
    print(f"step {h['step']} {h['segments']} segments exact {h['exact']:.2f} loss {h['loss']:.3f} {h['seconds']:.0f}s")
Path(sys.argv[2]).write_text("".join(json.dumps(row) + "\n" for row in rows))
print(len(rows), "per-sample lines")
EOF
if [ -n "${READER_PID:-}" ]; then
  wait "$READER_PID"; echo "[$(( $(date +%s) - T0 ))s] infllm reader exit $?"
  # the records this run added (those of the committed file are skipped), to append to benchmarks/results/infllm.jsonl
  "$PY" benchmarks/gpu/new_records.py benchmarks/results/infllm.jsonl "$OUT/infllm_gpu.jsonl" "$W/infllm.jsonl"
  tr '\r' '\n' <"$W/reader.log" | grep -v -E '%\|' >"$OUT/reader.log"
fi
cp -f "$W/runs/$RUN/report.json" "$W/runs/$RUN/curves.png" "$OUT/" 2>/dev/null
tr '\r' '\n' <"$W/train.log" | grep -v -E '%\|' >"$OUT/train.log"
