"""A real Slurm cluster of several "nodes" on this host, for tests (../shared/recipes/slurm.md).

Debian's slurm-wlm: one munged (only when none runs), one slurmctld and one ``slurmd -N nX`` per
node, all with their state, logs and pid files in one folder and on ports free right now, so
clusters of concurrent test sessions do not meet. Each cluster numbers its jobs from its own
block of 100 (``FirstJobId``), since ``--launcher slurm`` derives the rendezvous port from the
job id: two clusters on one host that both start at job 1 bind the same port. Stopped by the
pids it started, never by name.
"""

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from kit.launch.local import free_port

PACKAGES = ("slurm-wlm", "munge")


def _free_ports(n: int) -> list[int]:
    """``n`` different ports free now, outside the range the kernel hands to connections."""
    ports: list[int] = []
    while len(ports) < n:
        if (port := free_port()) not in ports:
            ports.append(port)
    return ports


def install() -> str | None:
    """Install the packages when missing; the reason they cannot be, or None."""
    if all(shutil.which(c) for c in ("slurmctld", "slurmd", "srun", "munged")):
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "slurm-wlm is not installed and this is not a root Debian host to install it on"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]
    if subprocess.run(cmd, env=env, capture_output=True).returncode:
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True)
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if r.returncode:
            return f"apt-get install {' '.join(PACKAGES)} failed: {r.stderr.strip()[-200:]}"
    return None


@dataclass
class Cluster:
    """A running private cluster: its config and the daemons it started."""

    root: Path
    nodes: int
    pids: list[int] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    def env(self) -> dict[str, str]:
        """Environment for Slurm client commands of this cluster."""
        return dict(os.environ, SLURM_CONF=str(self.conf))


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _pid_file(path: Path, timeout_s: float = 10) -> int:
    """The pid a daemon wrote (it may write it just after it forked)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return int(path.read_text())
        except (OSError, ValueError):
            time.sleep(0.05)
    raise RuntimeError(f"{path} was not written")


def start(root: Path, nodes: int = 2, cpus: int = 4, kill_wait_s: int = 30) -> Cluster:
    """Bring the cluster up and wait until every node is idle."""
    for d in ("etc", "state", "spool", "log", "run"):
        (root / d).mkdir(parents=True, exist_ok=True)
    cluster = Cluster(root, nodes)
    ctld, *node_ports = _free_ports(1 + nodes)
    host = socket.gethostname().split(".")[0]
    node_lines = "\n".join(
        f"NodeName=n{i + 1} NodeHostname={host} NodeAddr=127.0.0.1 Port={p} CPUs={cpus} "
        "State=UNKNOWN" for i, p in enumerate(node_ports))
    cluster.conf.write_text(f"""ClusterName=kit{ctld}
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={root}/log/jobcomp.txt
SchedulerType=sched/backfill
ReturnToService=2
SlurmdParameters=config_overrides
KillWait={kill_wait_s}
MinJobAge=600
FirstJobId={1 + ctld % 100 * 100}
{node_lines}
PartitionName=ci Nodes=n[1-{nodes}] Default=YES MaxTime=60 State=UP
""")
    env = cluster.env()
    munge_ok = subprocess.run("munge -n </dev/null | unmunge", shell=True,
                              capture_output=True).returncode == 0
    if not munge_ok:  # as Debian's init script runs it
        subprocess.run(["install", "-d", "-o", "munge", "-g", "munge", "-m", "0755",
                        "/run/munge"], check=True)
        subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], check=True)
        cluster.pids.append(int(Path("/run/munge/munged.pid").read_text()))
    subprocess.run(["slurmctld", "-c"], env=env, check=True)
    cluster.pids.append(_pid_file(root / "run" / "slurmctld.pid"))
    for i in range(nodes):
        subprocess.run(["slurmd", "-N", f"n{i + 1}"], env=env, check=True)
        cluster.pids.append(_pid_file(root / "run" / f"slurmd-n{i + 1}.pid"))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        idle = subprocess.run(["sinfo", "-h", "-N", "-t", "idle", "-o", "%N"], env=env,
                              capture_output=True, text=True).stdout.split()
        if len(set(idle)) == nodes:
            return cluster
        time.sleep(0.5)
    stop(cluster)
    raise RuntimeError(f"slurm nodes did not become idle; see {root}/log")


def stop(cluster: Cluster) -> None:
    """Cancel this cluster's jobs and stop the daemons it started, by pid (newest first)."""
    subprocess.run(["scancel", "--full", "--user=root"], env=cluster.env(), capture_output=True)
    for pid in reversed(cluster.pids):
        try:
            os.kill(pid, 15)
        except ProcessLookupError:
            continue
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            os.kill(pid, 9)
