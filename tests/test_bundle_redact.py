"""``bundle pack --redact``: a bundle seeded with everything a site would not share, packed, and
the archive searched for each seed in every form; the redacted bundle still verifies."""

import gzip
import json
from pathlib import Path

from tests.conftest import why_failed
from tests.hostile_bundles import copy_bundle, edit_json

INVENTORY_UUID = "GPU-618c5ede-81ec-b472-43ee-23bfe3919b57"
OTHER_UUID = "GPU-0a1b2c3d-4e5f-6789-abcd-ef0123456789"
SEEDS = {
    "hf token": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123",
    "api key": "0f9e8d7c6b5a4f3e2d1c",
    "password": "hunter2pass",
    "option token": "zz-token-value-77",
    "account": "proj-secret42",
    "partition": "gpu-special",
    "scratch user": "bobsmith",
    "work user": "dave7x",
    "home user": "alicew",
    "e-mail": "carol.jones@uni-example.de",
    "e-mail domain": "uni-example.de",
    "extra host": "login07",
    "domain": "hpc.example.edu",
    "inventory host": "gpu-node-17",
    "node list member": "gpu-node-19",
    "family member": "gpu-node-42",
    "node list": "gpu-node-[17-20]",
    "inventory domain": "cluster.example.org",
    "ipv4": "10.20.30.40",
    "ipv6": "fd00::1234",
    "inventory uuid": "618c5ede-81ec-b472-43ee-23bfe3919b57",
    "other uuid": "0a1b2c3d-4e5f-6789-abcd-ef0123456789",
    "serial": "1652422012345",
}
SBATCH = f"""#!/bin/bash
#SBATCH --account={SEEDS['account']}
#SBATCH --partition={SEEDS['partition']}
#SBATCH --nodelist={SEEDS['node list']}
#SBATCH --chdir=/scratch/{SEEDS['scratch user']}/runs
export HF_TOKEN={SEEDS['hf token']}
export WANDB_API_KEY="{SEEDS['api key']}"
export DB_PASSWORD='{SEEDS['password']}'
srun charllm-kit run gpt3-tiny --out /home/{SEEDS['home user']}/out
"""
LOG = f"""mail to {SEEDS['e-mail']} when done
SLURMD_NODENAME={SEEDS['extra host']}
SLURM_SUBMIT_HOST={SEEDS['extra host'].upper()}.{SEEDS['domain']}
rendezvous {SEEDS['inventory host'].upper()}.{SEEDS['inventory domain']} {SEEDS['ipv4']}:29500
peer {SEEDS['node list member']} and {SEEDS['family member']} via {SEEDS['ipv6']}
devices {INVENTORY_UUID} {OTHER_UUID.lower()} {OTHER_UUID.upper()}
Serial Number : {SEEDS['serial']}
cache /work/{SEEDS['work user']}/cache
"""


def _seed(manifest: dict) -> None:
    node = manifest["inventory"][0]
    node["host"] = f"{SEEDS['inventory host']}.{SEEDS['inventory domain']}"
    node["gpus"][0]["serial"] = SEEDS["serial"]
    manifest["command"] += ["--hf-token", SEEDS["option token"]]


def test_redacted_pack_removes_every_seeded_secret_and_still_verifies(cli, tmp_path):
    bundle = copy_bundle(tmp_path / "src")
    (bundle / "job").mkdir()
    (bundle / "job" / "sbatch.sh").write_text(SBATCH)
    with (bundle / "logs" / "rank0.log").open("a") as log:
        log.write(LOG)
    edit_json(bundle, "manifest.json", _seed)
    assert cli("bundle", "verify", str(bundle)).returncode == 0

    archive = tmp_path / "r.tar.gz"
    r = cli("bundle", "pack", str(bundle), "--redact", "--redact-partitions", "-o", str(archive))
    assert r.returncode == 0, why_failed(r)
    data = gzip.decompress(archive.read_bytes()).lower()
    left = [kind for kind, seed in SEEDS.items() if seed.lower().encode() in data]
    assert not left, left

    r = cli("bundle", "unpack", str(archive), "-o", str(tmp_path / "in"))  # verifies it
    assert r.returncode == 0, why_failed(r)
    redacted = Path(r.stdout.strip())
    manifest = json.loads((redacted / "manifest.json").read_text())
    assert manifest["inventory"][0]["host"] == "node0"
    assert manifest["inventory"][0]["gpus"][0]["uuid"] == "GPU-uuid-0"
    assert manifest["inventory"][0]["gpus"][0]["serial"] == "serial-0"
    log = (redacted / "logs" / "rank0.log").read_text()
    assert "devices gpu-uuid-0 gpu-uuid-1 gpu-uuid-1" in log.lower()  # devices stay distinct
    script = (redacted / "job" / "sbatch.sh").read_text()
    assert "export HF_TOKEN=<secret>" in script and "#SBATCH --account=<account>" in script
    rules = manifest["redaction"]["removed"]
    assert len(rules) == 9 and rules[2].startswith("partitions: "), rules
    assert all(not r.endswith("(0 replaced)") for r in rules), rules
