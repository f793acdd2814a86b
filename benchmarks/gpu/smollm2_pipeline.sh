#!/usr/bin/env bash
# Trains the shipped SmolLM2-135M adapters and measures them on held-out text.
#
# Three runs with the same data, budget and LoRA (rank 8 on the backbone, peft's Llama targets), so the comparison
# isolates the memory (the HMT paper fine-tunes its baselines too):
#   baseline  "rmt" with 0 memory tokens = each segment alone, LoRA only (evaluated with a sliding window)
#   rmt       1 memory token, 2 segments then STAGE2_SEGMENTS
#   hmt       stage 1 without retrieval over 2 segments, stage 2 with retrieval over STAGE2_SEGMENTS
# then perplexity against length on held-out Austen and KJV documents, and training memory against BPTT depth
# (on a GPU: torch.cuda.max_memory_allocated).
#
#   bash benchmarks/gpu/smollm2_pipeline.sh runs/smollm2          # GPU (the shipped adapters: one H100, see model card)
#   STEPS1=2 STEPS2=2 BATCH=1 EVAL_LENGTH=1024 bash benchmarks/gpu/smollm2_pipeline.sh runs/smoke   # CPU smoke run
set -euo pipefail
OUT=${1:-runs/smollm2}
STEPS1=${STEPS1:-200}
STEPS2=${STEPS2:-200}
STAGE2_SEGMENTS=${STAGE2_SEGMENTS:-8}
BATCH=${BATCH:-8}
LR=${LR:-5e-4}
EVAL_LENGTH=${EVAL_LENGTH:-32768}
COMMON=(--corpus austen --segment-length 256 --sensory-length 32 --memory-window 300 --retrieval-dim 1536
        --stage1-steps "$STEPS1" --stage2-steps "$STEPS2" --stage2-segments "$STAGE2_SEGMENTS"
        --batch-size "$BATCH" --lr "$LR" --lora --save-steps 100000 --eval-tokens 4096)

python examples/train_hmt.py --method hmt "${COMMON[@]}" --output "$OUT/hmt"
python examples/train_hmt.py --method rmt --num-memory-tokens 1 "${COMMON[@]}" --output "$OUT/rmt"
python examples/train_hmt.py --method rmt --num-memory-tokens 0 "${COMMON[@]}" --output "$OUT/baseline"

ADAPTERS=(hmt="$OUT/hmt/stage2" rmt="$OUT/rmt/stage2" baseline="$OUT/baseline/stage2")
LENGTHS=(1024 2048 4096 8192 16384 32768)
for corpus in austen kjv; do
  python benchmarks/ppl_vs_length.py --adapters "${ADAPTERS[@]}" --corpus "$corpus" --documents 2 \
    --max-length "$EVAL_LENGTH" --lengths "${LENGTHS[@]}"
done
if python -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
  python benchmarks/training_memory.py --device cuda --hidden 1024 --layers 12 --segment-length 512
fi
