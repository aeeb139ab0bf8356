"""``bundle recover``: publish the staging folder a killed launcher left behind.

A launcher killed outright (the OOM killer, SIGKILL, a node reboot) cannot publish its bundle,
but its staging folder holds what the run recorded: every step the ranks streamed, every
telemetry chunk, the ranks' logs, and the results of ranks that ended. This assembles them
through the same code as a live run (kit.bundle.assemble), with status ``failed`` and the
reason, once the launcher is known to be dead.
"""

from pathlib import Path

from kit.bundle.assemble import RunEnd, assemble_bundle, read_sampler_report
from kit.bundle.writer import SUMS_NAME, BundleStaging
from kit.errors import BundleError, KitInputError
from kit.launch.rankfile import (
    CONFIG_FILE,
    LAUNCHER_FILE,
    SCRATCH,
    read_config,
    read_launcher_record,
)


def recover_bundle(path: Path) -> Path:
    """Publish the staging folder ``path`` (``OUT/.<bundle_id>.partial``) as a bundle.

    Returns:
        The published bundle directory.

    Raises:
        BundleError: ``path`` is not a staging folder a launcher wrote, or its bundle exists.
        KitInputError: Its launcher is still running on this host.
        OSError: A file could not be written (the staging folder is left as it was).
    """
    staging = BundleStaging.reopen(path)
    if (staging.path / SUMS_NAME).is_file():
        # The launcher died after every file and the checksums were written: finish the job.
        return staging.publish((staging.chunks_dir.name, *SCRATCH))
    for name in (LAUNCHER_FILE, CONFIG_FILE):
        if not (staging.path / name).is_file():
            raise BundleError(f"{path} is not a staging folder a launcher wrote: no {name}")
    try:
        launcher = read_launcher_record(staging.path)
        cfg = read_config(staging.path)
    except ValueError as e:
        raise BundleError(f"{path}: {str(e).splitlines()[0]}") from None
    alive = launcher.alive()
    if launcher.pid in alive:
        raise KitInputError(f"{path}: its launcher (pid {launcher.pid}) is still running; it "
                            "publishes the bundle itself when it ends")
    if alive:
        raise KitInputError(f"{path}: ranks of the dead launcher still run (pids "
                            f"{', '.join(map(str, alive))}); they stop within seconds: retry then")
    end = RunEnd(
        "failed",
        f"launcher was killed (or could not write the bundle): pid {launcher.pid} on "
        f"{launcher.host} ended without publishing it",
        notes=["recovered from the staging folder by `charllm-kit bundle recover`: rank exit "
               "codes and times were not seen; steps and telemetry are those written before "
               "the launcher died"],
    )
    report = read_sampler_report(staging.chunks_dir)
    why = "no telemetry was recorded before the launcher died" if report is None else (
        "no source read it")
    bundle, _ = assemble_bundle(staging, cfg, launcher.command, end, report, why)
    return bundle
