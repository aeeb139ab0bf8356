set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, megatron.core as m, deepspeed; print('torch', torch.__version__, 'megatron-core', m.__version__, 'deepspeed', deepspeed.__version__)" 2>&1 | tail -1
run() { echo "\$ charllm-kit run $*"; timeout 150 python3 -m kit run "$@" --telemetry-interval-ms 100 --out /tmp/runs 2>&1 | grep -v -i warn | grep -E "^(status|step time|TFLOP|MFU|peak memory|mean power|energy)|rror|refused" | head -8; }
run gpt3-1.3b --micro-batch 4 --global-batch 16 --steps 5 --warmup 2 --recompute full
run mixtral-tiny --steps 5 --warmup 2
run gpt3-small --steps 5 --warmup 2 --engine deepspeed --zero 1
run gpt3-small --steps 5 --warmup 2 --engine deepspeed --zero 3
for b in /tmp/runs/2*; do python3 -m kit bundle verify $b | tail -1; done
