"""NVLink byte counters: NVML's own sum over every link (scope UINT_MAX) against one entry per
link, on this GPU machine (issue 33: the per-link reads were the sampler's costliest query).

    python3 benchmarks/telemetry/nvlink_aggregate.py [--reads 40] [--json OUT.json]

Per device: the CPU time of one TX+RX read both ways, and whether they agree: the counters are
read both ways before and after copying 4 GiB from GPU 0 to GPU 1 (peer to peer, over NVLink),
and the rise of NVML's sum is compared with the rise of the per-link sum.
"""

import argparse
import json
import time

import pynvml as nv
import torch

ALL_LINKS = 0xFFFFFFFF
FIELDS = (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)


def links(h) -> list[int]:
    """The device's NVLink links that are up."""
    up = []
    for link in range(nv.NVML_NVLINK_MAX_LINKS):
        try:
            if nv.nvmlDeviceGetNvLinkState(h, link) == nv.NVML_FEATURE_ENABLED:
                up.append(link)
        except nv.NVMLError:
            pass
    return up


def read(h, scopes: list[int]) -> tuple[int, int] | str:
    """(TX, RX) KiB summed over ``scopes``, or the NVML error."""
    got = nv.nvmlDeviceGetFieldValues(h, [(f, s) for f in FIELDS for s in scopes])
    bad = [v.nvmlReturn for v in got if v.nvmlReturn != nv.NVML_SUCCESS]
    if bad:
        return str(nv.NVMLError(bad[0]))
    n = len(scopes)
    return (sum(v.value.ullVal for v in got[:n]), sum(v.value.ullVal for v in got[n:]))


def cpu_ms(h, scopes: list[int], reads: int) -> float:
    """CPU milliseconds of one read."""
    t0 = time.process_time()
    for _ in range(reads):
        read(h, scopes)
    return 1e3 * (time.process_time() - t0) / reads


def main() -> None:
    """Print and write the comparison."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--reads", type=int, default=40)
    ap.add_argument("--json")
    args = ap.parse_args()
    nv.nvmlInit()
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
    per_dev = []
    before = [(read(h, [ALL_LINKS]), read(h, links(h))) for h in handles]
    if len(handles) > 1:
        x = torch.empty(4 << 30, dtype=torch.uint8, device="cuda:0")
        x.to("cuda:1")
        torch.cuda.synchronize(1)
    after = [(read(h, [ALL_LINKS]), read(h, links(h))) for h in handles]
    for i, h in enumerate(handles):
        up = links(h)
        (agg0, sum0), (agg1, sum1) = before[i], after[i]
        row = {"device": i, "links": len(up), "aggregate": agg0 if isinstance(agg0, str) else "ok",
               "cpu_ms_per_link": cpu_ms(h, up, args.reads)}
        if not isinstance(agg0, str):
            row["cpu_ms_aggregate"] = cpu_ms(h, [ALL_LINKS], args.reads)
            row["rise_kib_aggregate"] = [agg1[k] - agg0[k] for k in (0, 1)]
            row["rise_kib_per_link"] = [sum1[k] - sum0[k] for k in (0, 1)]
        per_dev.append(row)
        print(json.dumps(row))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%FT%TZ", time.gmtime()),
                       "gpu": nv.nvmlDeviceGetName(handles[0]), "devices": per_dev}, f, indent=1)


if __name__ == "__main__":
    main()
