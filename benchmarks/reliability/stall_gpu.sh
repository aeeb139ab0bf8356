#!/usr/bin/env bash
# Stall watchdog under NCCL on 4 GPUs (issue 27): a TP2 x DP2 gpt3-1.3b run whose rank 1 is
# SIGSTOPped after a few steps, --stall-timeout-s 30. Prints the launcher's output, the time from
# the SIGSTOP to the launcher's exit, the bundle's status and error, and what each rank's
# flight recorder says; writes the log and the bundle's manifest.json, metrics.json and
# logs/stall-watchdog.json into $OUT. One device-tool call, under 6 minutes.
#   bash benchmarks/reliability/stall_gpu.sh          # 4 GPUs, NCCL
#   bash benchmarks/reliability/stall_gpu.sh --cpu    # the same layout on a CPU host, gloo, gpt3-tiny
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/stall-gpu}"; mkdir -p "$OUT"
if [ "${1:-}" = "--cpu" ]; then
  TAG=cpu; ARGS="gpt3-tiny --platform cpu --tp 2 --dp 2"
else
  TAG=gpu; ARGS="gpt3-1.3b --tp 2 --dp 2 --micro-batch 4 --global-batch 16 --speed none"
fi
W=$(mktemp -d)
{
  echo "# $(date -u +%FT%TZ) stall watchdog ($TAG) at $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  if [ "$TAG" = gpu ]; then
    echo "# $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x$(nvidia-smi -L | wc -l), driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
  fi
  python3 -c "import torch, megatron.core as m; print('# torch', torch.__version__, 'megatron-core', m.__version__, 'nccl', torch.cuda.nccl.version() if torch.cuda.is_available() else None)" 2>&1 | tail -1
  python3 - "$W" "$OUT" "$TAG" $ARGS <<'EOF'
import json, os, shutil, signal, subprocess, sys, time
from pathlib import Path

import psutil

work, out, tag, args = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4:]
STALL_S, STOP_AFTER, DEADLINE_S = 30, 12, 320
cmd = [sys.executable, "-m", "kit", "run", *args, "--steps", "100000", "--warmup", "3",
       "--stall-timeout-s", str(STALL_S), "--out", str(work)]
print("$ charllm-kit", " ".join(cmd[3:]), flush=True)
t_start = time.monotonic()
launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def rank_pid(rank):
    for child in psutil.Process(launcher.pid).children():
        try:
            if "kit.launch.worker" in child.cmdline() and child.environ().get("RANK") == str(rank):
                return child.pid
        except psutil.Error:
            continue
    return None


def streamed(rank):
    path = next(work.glob(f".*.partial/ranks/rank{rank}.steps.jsonl"), None)
    return path.read_text().count("\n") if path else 0


while streamed(1) < STOP_AFTER and launcher.poll() is None:
    if time.monotonic() - t_start > DEADLINE_S - STALL_S - 60:
        print("rank 1 did not reach its steps in time"); launcher.kill(); sys.exit(1)
    time.sleep(0.2)
pid = rank_pid(1)
print(f"startup and {STOP_AFTER} steps took {time.monotonic() - t_start:.1f} s; "
      f"SIGSTOP to rank 1 (pid {pid}) after its step {streamed(1) - 1}", flush=True)
os.kill(pid, signal.SIGSTOP)
t0 = time.monotonic()
try:
    output, errors = launcher.communicate(timeout=DEADLINE_S - (t0 - t_start))
    ended = time.monotonic() - t0
except subprocess.TimeoutExpired:
    launcher.kill(); os.kill(pid, signal.SIGKILL)
    output, errors = launcher.communicate()
    ended = None
lines = [ln for ln in errors.splitlines() if " step " not in ln or "stall" in ln]
print("--- launcher stderr (progress lines left out) ---", *lines[-30:],
      "--- launcher stdout ---", *output.splitlines()[-40:], "---", sep="\n")
print(f"launcher exit {launcher.returncode}, "
      + (f"{ended:.1f} s after the SIGSTOP (stall timeout {STALL_S} s)" if ended is not None
         else "did not end in time: killed"))
bundle = Path(output.strip().splitlines()[-1])
if not (bundle / "manifest.json").is_file():
    print("no bundle"); sys.exit(1)
verify = subprocess.run([sys.executable, "-m", "kit", "bundle", "verify", str(bundle)],
                        capture_output=True, text=True)
print("bundle verify:", (verify.stdout + verify.stderr).strip())
m = json.loads((bundle / "manifest.json").read_text())
metrics = json.loads((bundle / "metrics.json").read_text())
print("status:", m["status"]); print("error:", m["error"])
record_path = bundle / "logs" / "stall-watchdog.json"
record = json.loads(record_path.read_text()) if record_path.is_file() else {}
print("stalled_s", record.get("stalled_s"), "limit", record.get("limit"), "blamed", record.get("blamed"))
for rank in range(len(m["ranks"])):
    fr = bundle / "logs" / f"rank{rank}.flight-recorder.json"
    log = (bundle / "logs" / f"rank{rank}.log").read_text(errors="replace")
    if fr.is_file():
        dump = json.loads(fr.read_text())
        ops = sorted({e.get("profiling_name") for e in dump.get("entries", [])})
        what = (f"{len(dump.get('entries', []))} entries, ops {ops[:6]}" if "entries" in dump
                else f"unavailable: {dump.get('unavailable')}")
    else:
        what = "no file"
    info = record.get("ranks", {}).get(str(rank), {})
    print(f"rank {rank}: flight recorder {what}; stack in log: "
          f"{'(most recent call first)' in log}; process {info.get('process_state')}; "
          f"in {info.get('in_collective')}")
for note in metrics["notes"]:
    print("note:", note)
sys.path.insert(0, os.getcwd())
from kit.metrics.stragglers import straggler_line  # noqa: E402
print("stragglers before the stall:", straggler_line(metrics.get("stragglers", {})))
for name, src in (("manifest", bundle / "manifest.json"), ("metrics", bundle / "metrics.json"),
                  ("stall-watchdog", record_path)):
    if src.is_file():
        shutil.copy(src, out / f"stall-{tag}-{name}.json")
sys.exit(0 if m["status"] == "failed" and record.get("blamed") == [1] else 1)
EOF
  rc=$?
  if [ "$TAG" = gpu ]; then
    echo "GPU compute processes after the run: $(nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -c .)"
  fi
  exit $rc
} 2>&1 | tee "$OUT/stall-$TAG.txt"
rc=${PIPESTATUS[0]}
rm -rf "$W"
exit "$rc"
