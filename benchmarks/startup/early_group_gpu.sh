#!/usr/bin/env bash
# Does the default process group made on a thread (kit/launch/early_groups.py) work with NCCL?
# Issue 34's check before it is on for GPU ranks: gpt3-1.3b DP over every GPU of this machine
# (LAYOUTS="--dp 4;--tp 2 --sp --dp 2" for more layouts), with the group made on the thread and
# then made in the engine's setup (CHARLLM_EARLY_PROCESS_GROUP=0), one compile cache for all
# the runs (the first fills it). Prints each run's status and lifecycle line; exits 1 if a threaded run failed
# where its engine-setup twin did not, so that a caller can fall back:
#   bash benchmarks/startup/early_group_gpu.sh || export CHARLLM_EARLY_PROCESS_GROUP=0
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
source benchmarks/lib.sh
use_carried_wheels
OUT="${OUT:?set OUT}"; mkdir -p "$OUT"
TAG=$(gpu_tag); N=${TAG##*x}; PLATFORM=${TAG%x*}
export CHARLLM_COMPILE_CACHE="${CHARLLM_COMPILE_CACHE:-/tmp/early-group-cache}"
exec > >(tee -a "$OUT/early-group-$TAG.txt") 2>&1
echo "# $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) x$N; kit ${KIT_COMMIT:-unknown}"
rc=0
IFS=';' read -r -a layouts <<< "${LAYOUTS:---dp $N}"
for layout in "${layouts[@]}"; do
  for early in 1 0; do
    echo "## CHARLLM_EARLY_PROCESS_GROUP=$early charllm-kit run gpt3-1.3b --platform $PLATFORM $layout --micro-batch 2 --global-batch 16 --steps 3 --warmup 2 --telemetry-interval-ms 0"
    # shellcheck disable=SC2086
    CHARLLM_EARLY_PROCESS_GROUP=$early timeout -k 10 150 python3 -m kit run gpt3-1.3b \
      --platform "$PLATFORM" $layout --micro-batch 2 --global-batch 16 --steps 3 --warmup 2 \
      --telemetry-interval-ms 0 --out /tmp/early-group 2>&1 \
      | grep -E "launch to first step|measured .*s/step|rror|failed|^/tmp/early-group" | tail -4
    status=${PIPESTATUS[0]}
    echo "exit $status"
    [[ $early == 1 ]] && threaded=$status
    [[ $early == 0 && $threaded != 0 && $status == 0 ]] && rc=1
  done
done
echo "# done in ${SECONDS}s; $([[ $rc == 0 ]] && echo 'the threaded group held' || echo 'the threaded group FAILED where the engine-made one worked')"
exit $rc
