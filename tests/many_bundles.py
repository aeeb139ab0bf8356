"""Many bundles cheaply, for reports at scale: copies of the recorded GPU bundles made 4-GPU
layouts.

Each copy takes one of the recorded single-GPU bundles (tests/data/bundles/*/: H100 and H200,
gpt3-1.3b and mixtral-8x7b-4l), gives it a 4-GPU layout and a micro-batch size, and turns its
one GPU's telemetry into four: devices 1-3 are device 0's samples with power, temperature and
SM clock shifted as a position further from the air inlet would see them (cumulative counters
scaled, so they still only rise). Throughput, MFU and power in ``metrics.json`` move with the
layout by a fixed rule, so a sweep over micro-batch size and degrees shows lines, and a repeat
of a configuration is 0.4% faster than the one before it, so repeats have a spread. One bundle in
every 25 ended ``failed``, with idle telemetry. Each copy gets its own bundle id and a
``SHA256SUMS`` over its files, so it verifies like a real bundle.
"""

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kit.bundle.writer import write_sums

REPO = Path(__file__).resolve().parents[1]
SOURCES = sorted((REPO / "tests/data/bundles").glob("*/2*"))
LAYOUTS = ((1, 1), (2, 1), (4, 1), (2, 2), (1, 4))
"""(TP, PP) of the copies; DP makes up four GPUs."""
MICRO_BATCHES = (1, 2, 4, 8)
GPUS = 4
_SCALED = ("tokens_per_s", "tflops_per_gpu", "mfu")


def _telemetry(table: pa.Table, failed: bool) -> pa.Table:
    """Device 0's rows as four devices, shifted per position; idle power for a failed run."""
    gpu = table.filter(pc.equal(table["source"], "gpu"))
    parts = [table.filter(pc.not_equal(table["source"], "gpu"))]
    for d in range(GPUS):
        rows = gpu.set_column(gpu.schema.get_field_index("device"), "device",
                              pa.array([d] * gpu.num_rows, gpu.schema.field("device").type))
        shifts = {"temp_gpu_c": lambda c, d=d: pc.add(c, 2.5 * d),
                  "power_w": lambda c, d=d: pc.multiply(c, (0.15 if failed else 1 + 0.03 * d)),
                  "clock_sm_mhz": lambda c, d=d: pc.subtract(c, 15.0 * d)}
        for name in ("energy_j", "link_tx_bytes", "link_rx_bytes", "pcie_tx_bytes",
                     "pcie_rx_bytes"):
            shifts[name] = lambda c, d=d: pc.multiply(c, 1 + d)
        for name, shift in shifts.items():
            if name in rows.column_names:
                i = rows.schema.get_field_index(name)
                field = rows.schema.field(i)
                rows = rows.set_column(i, field, pc.cast(shift(rows[name]), field.type,
                                                         safe=False))
        parts.append(rows)
    return pa.concat_tables(parts)


def _copy(source: Path, out: Path, i: int) -> Path:
    tp, pp = LAYOUTS[(i // len(SOURCES)) % len(LAYOUTS)]
    mb = MICRO_BATCHES[(i // (len(SOURCES) * len(LAYOUTS))) % len(MICRO_BATCHES)]
    failed = i % 25 == 7
    manifest = json.loads((source / "manifest.json").read_text())
    dest = out / f"{source.name[:16]}-copy{i:03d}-{manifest['workload']['name']}"
    shutil.copytree(source, dest)
    config = manifest["config"]
    config["parallel"].update(tp=tp, pp=pp, dp=GPUS // (tp * pp))
    config["micro_batch_size"] = mb
    config["global_batch_size"] = max(config["global_batch_size"], mb * GPUS)
    rank = manifest["ranks"][0]
    manifest["ranks"] = [{**rank, "rank": r, "local_rank": r, "stage": r // (GPUS // pp),
                          "pp_rank": r // (GPUS // pp), "tp_rank": r % tp,
                          "dp_rank": (r // tp) % (GPUS // (tp * pp)),
                          **({"status": "failed", "error": "CUDA out of memory"} if failed
                             else {})} for r in range(GPUS)]
    gpu = manifest["inventory"][0]["gpus"][0]
    manifest["inventory"][0]["gpus"] = [{**gpu, "device": d, "uuid": f"{gpu['uuid'][:-3]}{d:03d}"}
                                        for d in range(GPUS)]
    if failed:
        manifest["status"], manifest["error"] = "failed", "rank 2: CUDA out of memory"
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=2))

    metrics = json.loads((dest / "metrics.json").read_text())
    speed = (1.0 + 0.1 * (mb - 1) ** 0.5) / (1.0 + 0.08 * (tp - 1) + 0.12 * (pp - 1))
    speed *= 1 + 0.004 * (i // (len(SOURCES) * len(LAYOUTS) * len(MICRO_BATCHES)))  # repeats
    summary = metrics["summary"]
    for key in _SCALED:
        if summary.get(key) is not None:
            summary[key] = None if failed else summary[key] * speed
    if summary.get("step_time_s") is not None:
        summary["step_time_s"] = None if failed else summary["step_time_s"] / speed
    if summary.get("energy_j_per_token") is not None:
        summary["energy_j_per_token"] = None if failed else summary["energy_j_per_token"] / speed
    summary["world_size"] = GPUS
    device = metrics["per_device"][0] if metrics.get("per_device") else None
    if device is not None:
        metrics["per_device"] = [{**device, "device": d} for d in range(GPUS)]
    (dest / "metrics.json").write_text(json.dumps(metrics, indent=2))

    telemetry = pq.read_table(dest / "telemetry.parquet")
    pq.write_table(_telemetry(telemetry, failed), dest / "telemetry.parquet")
    write_sums(dest)
    return dest


def many_bundles(out: Path, n: int) -> list[Path]:
    """``n`` verified bundles under ``out`` (module docstring), in a fixed order."""
    out.mkdir(parents=True, exist_ok=True)
    return [_copy(SOURCES[i % len(SOURCES)], out, i) for i in range(n)]
