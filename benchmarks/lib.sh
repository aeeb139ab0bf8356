# Shared by the GPU evidence scripts: `source benchmarks/lib.sh` from the repository root.

# use_carried_wheels: where megatron-core, DeepSpeed or pydantic is missing and .whl/ holds
# wheels (this workplace's device tool carries them; the GPU machine has no index), install
# them into /tmp/site once and put it on PYTHONPATH and PATH; an earlier call's /tmp/site is
# reused as it is.
use_carried_wheels() {
  if ! python3 -c "import megatron.core, deepspeed, pydantic" >/dev/null 2>&1 \
      && ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl >/dev/null 2>&1
  fi
  if [[ -d /tmp/site ]]; then
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PATH="/tmp/site/bin:$PATH"
  fi
}

# gpu_tag: h100x4, h200x2, ... (the first GPU's kind and how many this machine has)
gpu_tag() {
  local kind
  kind=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE 'h100|h200' \
         | tr 'A-Z' 'a-z')
  echo "${kind:-gpu}x$(nvidia-smi -L | wc -l)"
}

# start_budget SECONDS: start the clock `left` reads (an evidence script's share of its
# 10-minute call). left [FLOOR]: the seconds left of it, never below FLOOR (default 0), for
# `timeout "$(left 10)" ...` or `(( $(left) > 30 ))`.
start_budget() { BUDGET_END=$(($(date +%s) + $1)); }
left() { local s=$((BUDGET_END - $(date +%s))) floor="${1:-0}"; echo $((s > floor ? s : floor)); }
