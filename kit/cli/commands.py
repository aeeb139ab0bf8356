"""The ``charllm-kit`` command line: click commands that parse, call one function and print.

Exit codes: 0 ok; 1 the run failed (its bundle is still written); 2 bad input, reported as one
line on stderr. A command line with ``--json`` gets every error, click's usage errors
included, as one JSON object ``{"error": "..."}`` on stdout instead, so a script that asked for
JSON can always parse what it gets.
"""

import itertools
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from kit import arrow_pandas
from kit.bundle.guard import bundle_input_errors
from kit.cli.cache import cache, compile_cache_option
from kit.cli.group import ImpliedRunGroup
from kit.cli.options import model_options
from kit.container import RUNTIMES
from kit.errors import KitInputError, RunNotPublished
from kit.fabric.request import FabricRequest, fabric_request
from kit.launch.sbatch import JOB_RUNTIMES, NOT_RUN_FIELDS, JobOptions, sweep_runtime_note
from kit.neutralize import terminal_safe
from kit.output_target import check_output_dir, check_output_file
from kit.plan.resolve import RunRequest
from kit.projection.request import ProjectionTarget
from kit.study.command import study

if TYPE_CHECKING:
    from kit.sweep.file import SweepSpec

ALLOW_UNVERIFIED = click.option(
    "--allow-unverified", is_flag=True,
    help="Use a bundle that fails verification, marked as unverified, instead of refusing it.")


@click.group(cls=ImpliedRunGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="charllm-kit")
def cli() -> None:
    """Characterize distributed LLM training: performance, power and thermals.

    A workload given first (a name or a YAML file) stands for `run WORKLOAD`.
    """


cli.add_command(cache)


@cli.command()
@click.argument("workload")
@model_options(RunRequest, skip=("workload",))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True, help="Directory that receives the bundle.")
@click.option("--dry-run", is_flag=True,
              help="Resolve, validate and estimate memory only; launch nothing.")
@click.option("--force", is_flag=True,
              help="Run even if the memory estimate predicts it will not fit.")
@click.option("--json", "as_json", is_flag=True,
              help="JSON output: the resolved plan, the run's status, summary and lifecycle "
                   "(start-up and teardown phases), or the error.")
@compile_cache_option
def run(workload: str, out: Path, dry_run: bool, force: bool, as_json: bool,
        **opts: object) -> None:
    """Train WORKLOAD on every rank, sample telemetry, and write one result bundle.

    A run predicted not to fit in device memory (see --dry-run) is refused unless --force.
    """
    from kit.cli.tables import next_steps, print_dry_run, print_summary
    from kit.plan import plan_run
    from kit.plan.resolve import run_request

    req = run_request(workload=workload, **opts)
    plan = plan_run(req, require_present=not dry_run)
    cfg = plan.cfg
    if plan.refusal and not (dry_run or force):
        raise KitInputError(plan.refusal)
    if dry_run:
        print_dry_run(cfg, as_json, plan.memory)
        return
    check_output_dir(out)
    from kit.container.detect import container_record, shm_hint
    from kit.launch.launchers import launch_run

    for warning in (plan.warning, shm_hint(container_record())):
        if warning:
            click.echo(f"warning: {terminal_safe(warning)}", err=True)

    # from publication on, SIGINT/SIGTERM are ignored: a late stop request cannot cut the
    # result's last line (the bundle path) short or change the exit code
    result = launch_run(cfg, req, out, command=sys.argv, ends_process=True)
    if result is None:
        _unknown_end(out)
    if as_json:
        click.echo(json.dumps({"status": result.status, "error": result.error,
                               "bundle": str(result.bundle.resolve()),
                               "summary": result.summary, "lifecycle": result.lifecycle,
                               "compile_cache": result.compile_cache}))
    else:
        print_summary(result)
        click.echo(str(result.bundle.resolve()))
        click.echo(next_steps(result.bundle.resolve()), err=True)
    if result.status != "ok":
        sys.exit(1)


def _unknown_end(out: Path) -> NoReturn:
    """Exit 1 on a node other than 0 that node 0 did not tell how the run ended."""
    click.echo("node 0 did not say how the run ended; its bundle (if any) is in "
               f"{out.resolve()}", err=True)
    sys.exit(1)


def _job_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Slurm's options of ``submit`` and ``sweep --launcher slurm`` (kit.launch.sbatch)."""
    for option in reversed((
        click.option("--partition", help="Slurm partition (default: the cluster's)."),
        click.option("--account", help="Slurm account to charge (default: yours)."),
        click.option("--time", "time_limit", default="01:00:00", show_default=True,
                     help="Job time limit, as sbatch takes it (HH:MM:SS, D-HH, minutes)."),
        click.option("--container-runtime", "runtime", type=click.Choice(JOB_RUNTIMES),
                     help="Start the node agents in the platform's image with pyxis (srun "
                          "--container-image) or apptainer; none: this Python on the nodes "
                          "(default: pyxis when the platform names a container_image and "
                          "this host's srun has pyxis, else none)."),
        click.option("--image", help="Container image (default: the platform's "
                                     "container_image)."),
    )):
        command = option(command)
    return command


def _job(partition: str | None, account: str | None, time_limit: str, runtime: str | None,
         image: str | None) -> JobOptions:
    return JobOptions(partition=partition, account=account, time=time_limit,
                      runtime=runtime, image=image)  # type: ignore[arg-type]


@cli.command()
@click.argument("workload")
@model_options(RunRequest, skip=NOT_RUN_FIELDS)
@_job_options
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True, help="Folder every node mounts: the bundle and the job's "
                                      "output (slurm-<job id>.out).")
@click.option("--wait", is_flag=True,
              help="Follow the job with a progress line until it ends; exit with the run's "
                   "status (0 ok, 1 not ok).")
@click.option("--dry-run", is_flag=True, help="Print the sbatch script; submit nothing.")
@click.option("--force", is_flag=True,
              help="Run even if the memory estimate predicts it will not fit.")
@click.option("--json", "as_json", is_flag=True,
              help="JSON output: the job id, the folders and the script's copy (with --wait, "
                   "the run's status and bundle; with --dry-run, the script), or the error.")
def submit(workload: str, out: Path, wait: bool, dry_run: bool, force: bool, as_json: bool,
           partition: str | None,
           account: str | None, time_limit: str, runtime: str | None, image: str | None,
           **opts: object) -> None:
    """Submit WORKLOAD as one Slurm job (sbatch) of --launcher slurm; print the job id.

    Takes the options of `run`. A copy of the script is kept beside the job's output
    (OUT/slurm-<job id>.sbatch); the bundle, in --out, holds it too (job/sbatch.sh) with the
    job id; see docs/multi-node.md.
    """
    from kit.launch.sbatch import absolute_files, job_output, job_runtime, sbatch_script
    from kit.launch.submit import early_failure, follow_job, keep_script, submit_job
    from kit.plan import plan_run
    from kit.plan.resolve import run_request

    req = absolute_files(run_request(workload=workload, launcher="slurm", **opts))
    plan = plan_run(req, require_present=False)  # the nodes have the devices, not this host
    if plan.refusal and not force:
        raise KitInputError(plan.refusal)
    job = _job(partition, account, time_limit, runtime, image)
    chosen, why = job_runtime(plan.cfg, job, submitting=not dry_run)
    # the script's checks first: a refused job says only why
    script = sbatch_script(plan.cfg, req, out, replace(job, runtime=chosen), force)
    for warning in (plan.warning, why):
        if warning:
            click.echo(f"warning: {terminal_safe(warning)}", err=True)
    if dry_run:
        if as_json:
            click.echo(json.dumps({"script": script, "out": str(out.absolute())}))
        else:
            click.echo(script, nl=False)
        return
    check_output_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    job_id = submit_job(script)
    answer: dict[str, Any] = {"job": job_id, "out": str(out.resolve()),
                              "output": str(job_output(out, job_id)),
                              "script": str(keep_script(out, job_id, script))}
    if not as_json:
        click.echo(f"submitted Slurm job {job_id}; its bundle will appear in {answer['out']} "
                   f"(the job's output: {answer['output']})")
    if not wait:
        failed = early_failure(job_id, out)
        if failed:
            answer.update(status="failed", error=failed)
        if as_json:
            click.echo(json.dumps(answer))
        elif failed:
            click.echo(f"error: {failed}", err=True)
        if failed:
            sys.exit(1)
        return
    bundle_dir = follow_job(job_id, out, lambda line: click.echo(line, err=True))
    _submit_end(answer, bundle_dir, as_json)


def _submit_end(answer: dict[str, Any], bundle_dir: Path | None, as_json: bool) -> None:
    """How a followed job ended: its bundle's status and path; exit 1 unless ok."""
    if bundle_dir is None:
        error = f"job {answer['job']} ended without a bundle; see {answer['output']}"
        answer.update(status=None, error=error, bundle=None)
    else:
        manifest = json.loads((bundle_dir / "manifest.json").read_text())
        answer.update(status=manifest["status"], error=manifest["error"],
                      bundle=str(bundle_dir.resolve()))
    if as_json:
        click.echo(json.dumps(answer))
    elif bundle_dir is None:
        click.echo(answer["error"], err=True)
    else:
        if answer["status"] != "ok":
            click.echo(f"{answer['status']}: {answer['error']}", err=True)
        click.echo(answer["bundle"])
    if answer["status"] != "ok":
        sys.exit(1)


@cli.command()
@model_options(FabricRequest)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True, help="Directory that receives the bundle.")
@click.option("--json", "as_json", is_flag=True, help="JSON output: status, bundle, results.")
def fabric(out: Path, as_json: bool, **opts: object) -> None:
    """Measure collective bandwidth (algbw and busbw as nccl-tests defines them); one bundle.

    Runs through the same launchers as `run` (--launcher torchrun|slurm for several nodes).
    The last stdout line is the bundle path; see docs/fabric.md.
    """
    from kit.fabric.results import fabric_table, read_fabric
    from kit.fabric.run import resolve_fabric, run_fabric

    req = fabric_request(**opts)
    cfg = resolve_fabric(req)
    check_output_dir(out)
    result = run_fabric(cfg, req, out, command=sys.argv, ends_process=True)
    if result is None:
        _unknown_end(out)
    from kit.bundle.reader import read_bundle

    results = read_fabric(read_bundle(result.bundle))
    if as_json:
        click.echo(json.dumps({"status": result.status, "error": result.error,
                               "bundle": str(result.bundle.resolve()),
                               "results": results.model_dump() if results else None}))
    else:
        if results is not None:
            click.echo(fabric_table(results))
        if result.error:
            click.echo(f"{result.status}: {result.error}", err=True)
        click.echo(str(result.bundle.resolve()))
    if result.status != "ok":
        sys.exit(1)


@cli.command()
@click.argument("sweep_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--dry-run", is_flag=True,
              help="List every point as valid or skipped with the reason; launch nothing.")
@click.option("--resume", is_flag=True,
              help="Continue the sweep folder: keep points whose bundle verifies.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True, help="Directory that receives the sweep folder <out>/<name>/.")
@click.option("--launcher", type=click.Choice(["local", "slurm"]), default="local",
              show_default=True, help="local: run the points here, one after another; slurm: "
                                      "submit each point as one Slurm job (the options below, "
                                      "as for `submit`) and follow them.")
@_job_options
@click.option("--json", "as_json", is_flag=True,
              help="JSON output: the dry-run plan (with --launcher slurm each point's job and "
                   "sbatch script), or the sweep folder and its index, or the error.")
@compile_cache_option
def sweep(sweep_file: Path, dry_run: bool, resume: bool, out: Path, launcher: str,
          partition: str | None, account: str | None, time_limit: str, runtime: str | None,
          image: str | None, as_json: bool) -> None:
    """Run every valid point of SWEEP_FILE (YAML), one bundle each; see docs/sweeps.md."""
    from kit.sweep.file import load_sweep
    from kit.sweep.tables import summary_table

    spec = load_sweep(sweep_file)
    check_output_dir(out)
    job = (_job(partition, account, time_limit, runtime, image) if launcher == "slurm"
           else None)
    if job is not None and (note := sweep_runtime_note(runtime)):
        click.echo(f"warning: {note}", err=True)
    if dry_run:
        _sweep_dry_run(spec, out, job, as_json, resume)
        return
    from kit.sweep.runner import run_sweep

    outcome = run_sweep(spec, sweep_file, out, resume, command=sys.argv, job=job)
    if as_json:
        click.echo(json.dumps({"folder": str(outcome.folder.resolve()),
                               "points": outcome.index.model_dump(mode="json")["points"]}))
    else:
        click.echo(summary_table(outcome.index))
        click.echo(str(outcome.folder.resolve()))
    if outcome.any_failed:
        sys.exit(1)


def _sweep_dry_run(spec: "SweepSpec", out: Path, job: JobOptions | None, as_json: bool,
                   resume: bool) -> None:
    """Print the plan; with ``job`` (``--launcher slurm``) as the real sweep would submit it;
    with ``resume``, which points are done (their bundle kept) and which would run."""
    from kit.sweep.jobs import planned_jobs, slurm_sweep
    from kit.sweep.plan import plan_sweep
    from kit.sweep.runner import kept_points
    from kit.sweep.tables import plan_json, plan_table

    if job is not None:
        spec = slurm_sweep(spec)
    plan = plan_sweep(spec, require_present=False)
    jobs = planned_jobs(plan, out / spec.name, job) if job is not None else None
    kept = kept_points(plan, out / spec.name) if resume else None
    if as_json:
        click.echo(json.dumps(plan_json(spec.name, plan, jobs, kept)))
        return
    click.echo(plan_table(plan, jobs, kept))
    click.echo("dry run: nothing launched" if jobs is None else
               "dry run: nothing submitted (--json prints each job's sbatch script)")


cli.add_command(study)


@cli.group()
def workloads() -> None:
    """Shipped workloads."""


@workloads.command("list")
def workloads_list() -> None:
    """List shipped workloads."""
    from kit.cli.tables import workloads_table

    click.echo(workloads_table())


@workloads.command("show")
@click.argument("name")
def workloads_show(name: str) -> None:
    """Show one workload's architecture (NAME or a YAML path)."""
    from kit.cli.tables import show_workload

    click.echo(show_workload(name))


@cli.group()
def platforms() -> None:
    """Shipped platform profiles."""


@platforms.command("list")
def platforms_list() -> None:
    """List shipped platforms."""
    from kit.cli.tables import platforms_table

    click.echo(platforms_table())


@platforms.command("show")
@click.argument("name")
def platforms_show(name: str) -> None:
    """Show one platform profile (NAME or a YAML path)."""
    from kit.cli.tables import show_platform

    click.echo(show_platform(name))


@platforms.command("detect")
def platforms_detect() -> None:
    """Print which platform this host is."""
    from kit.plan.detect import detect_platform
    from kit.telemetry.devices import local_accelerator_names

    spec = detect_platform()
    devices = ", ".join(local_accelerator_names()) or "no accelerators"
    click.echo(f"{spec.name}\t{spec.device_name} ({devices})")


@platforms.command("gemm")
@click.option("--platform", "platform_name", default=None,
              help="Platform profile this host is (default: detected).")
@click.option("--workload", "workloads", multiple=True, required=True,
              help="Workload whose layer GEMMs to time (repeat; depth does not matter).")
@click.option("--tp", "tps", default=None,
              help="TP degrees, comma-separated (default: those of 1,2,4,8 the workloads' "
              "heads and the platform's node allow).")
@click.option("--micro-batch", "micro_batches", default=None,
              help="Micro-batch sizes, comma-separated (default: 1,2).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Table file (default: results/<platform>.gemm.json; give it to `project` "
              "among its inputs, or write platforms/<platform>.gemm.json to keep it with the "
              "platform profile, where `project` finds it unnamed).")
@click.option("--min-time-ms", type=click.FloatRange(min=0.1), default=20.0, show_default=True,
              help="Length of each timed batch of calls.")
def platforms_gemm(platform_name: str | None, workloads: tuple[str, ...], tps: str | None,
                   micro_batches: str | None, output: Path | None, min_time_ms: float) -> None:
    """Measure this GPU kind's GEMM table: achieved TFLOP/s of torch.matmul at each shape the
    workloads' layers make under the TP degrees and micro-batches (project uses it to scale
    MatMul time by shape; docs/projection.md). Says its estimate and progress on stderr; on a
    CPU host, refuses default shapes that would take over 5 minutes. The last stdout line is
    the file's path."""
    from kit.plan.detect import detect_platform
    from kit.projection.gemm import SUFFIX, write_gemm_table
    from kit.projection.gemm_bench import measure_gemm_table

    name = platform_name or detect_platform().name
    table = measure_gemm_table(
        name, list(workloads), None if tps is None else _int_list(tps, "--tp"),
        None if micro_batches is None else _int_list(micro_batches, "--micro-batch"), sys.argv,
        min_time_ms / 1000, say=lambda line: click.echo(f"gemm: {line}", err=True))
    path = write_gemm_table(table, output or Path("results") / f"{table.platform}{SUFFIX}")
    rates = sorted(p.tflops for p in table.points)
    click.echo(f"{len(table.points)} GEMM shapes on {table.device} ({table.dtype}): "
               f"{rates[0]:.4g}..{rates[-1]:.4g} TFLOP/s")
    click.echo(str(path.resolve()))


def _int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise KitInputError(f"{option} {text!r}: give positive integers, comma-separated")
    return values


@cli.group()
def container() -> None:
    """Run the kit in a platform's container image; show the container this runs in."""


@container.command("show")
def container_show() -> None:
    """Print the container record the kit writes into bundles (JSON), or that there is none."""
    from kit.container.detect import container_record, shm_hint

    record = container_record()
    click.echo(record.model_dump_json(indent=2) if record else "not in a container")
    hint = shm_hint(record)
    if hint:
        click.echo(f"warning: {hint}", err=True)


@container.command("run", context_settings={"ignore_unknown_options": True})
@click.argument("workload")
@click.argument("run_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--platform", help="Platform name or YAML (default: detect this host).")
@click.option("--container-runtime", "runtime", type=click.Choice(RUNTIMES),
              help="Runtime (default: docker if its daemon listens, else podman, apptainer).")
@click.option("--image", help="Image to run (default: the platform's container_image).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True, help="Host folder for the bundle, bound at the same path.")
@click.option("--dry-run", is_flag=True, help="Print the command only; run nothing.")
def container_run(workload: str, run_args: tuple[str, ...], platform: str | None,
                  runtime: str | None, image: str | None, out: Path, dry_run: bool) -> None:
    """Run `charllm-kit run WORKLOAD RUN_ARGS...` inside the platform's image (docker/README.md).

    This is `./run.sh --container`. A platform not on this host is refused unless --dry-run.
    """
    import os
    import shlex

    from kit.container.command import run_in_container

    argv = run_in_container(workload, run_args, platform, runtime, image, out, dry_run)
    if dry_run:
        click.echo(shlex.join(argv))
        return
    check_output_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    click.echo(shlex.join(argv), err=True)
    os.execvp(argv[0], argv)


@cli.group()
def bundle() -> None:
    """Inspect, pack, unpack and export result bundles."""


@bundle.command("show")
@click.argument("path", type=click.Path(path_type=Path))
@ALLOW_UNVERIFIED
@bundle_input_errors
def bundle_show(path: Path, allow_unverified: bool) -> None:
    """Verify a bundle and summarize it (of a sweep folder: list its points' bundles)."""
    from kit.analysis.show import format_bundle, format_sweep_folder
    from kit.bundle.verified import read_verified_bundle
    from kit.sweep.folder import read_sweep_folder

    sweep = read_sweep_folder(path)
    if sweep is not None:
        click.echo(format_sweep_folder(sweep))
        return
    read = read_verified_bundle(path, allow_unverified)
    if read.verification_error:
        click.echo(f"warning: unverified: {terminal_safe(read.verification_error)}", err=True)
    click.echo(format_bundle(read))


@bundle.command("verify")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@bundle_input_errors
def bundle_verify(paths: tuple[Path, ...]) -> None:
    """Check bundles' checksums and schemas; exit 2 naming the first bad file."""
    from kit.bundle.verify import verify_bundle

    for p in paths:
        files = verify_bundle(p)
        click.echo(f"ok  {p}  ({len(files)} files)")


@bundle.command("recover")
@click.argument("path", type=click.Path(path_type=Path))
def bundle_recover(path: Path) -> None:
    """Publish the staging folder (OUT/.<id>.partial) a killed launcher left; print the bundle.

    Keeps every step and telemetry sample it recorded; the bundle's status is failed, with the
    reason. A multi-node run's folder (node 0's agent killed) is merged from every node's part.
    Refused while the launcher, another node's agent or a rank of the run still runs here.
    """
    from kit.bundle.verify import verify_bundle
    from kit.launch.recover import recover_bundle

    bundle_path = recover_bundle(path)
    verify_bundle(bundle_path)
    click.echo(str(bundle_path.resolve()))


@bundle.command("pack")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Archive to write (default: ./<bundle>.tar.gz).")
@click.option("--redact", is_flag=True, help="Remove secrets, accounts, user names, e-mail "
              "addresses, host names, IPs and device serials/UUIDs first (docs/security.md).")
@click.option("--redact-partitions", is_flag=True, help="With --redact: hide partitions too.")
def bundle_pack(path: Path, output: Path | None, redact: bool, redact_partitions: bool) -> None:
    """Verify a bundle and pack it into one .tar.gz; print the archive path."""
    from kit.bundle.pack import pack_bundle

    if redact_partitions and not redact:
        raise click.UsageError("--redact-partitions goes with --redact")
    click.echo(str(pack_bundle(path, output, redact=redact, partitions=redact_partitions)))


@bundle.command("unpack")
@click.argument("archive", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path),
              default=Path("."), help="Directory that receives the bundle (default: .).")
@bundle_input_errors
def bundle_unpack(archive: Path, output: Path) -> None:
    """Unpack an archive from anyone safely, verify it; print the bundle path."""
    from kit.bundle.unpack import unpack_bundle

    check_output_dir(output)
    click.echo(str(unpack_bundle(archive, output)))


def _emit(text: str, output: Path | None) -> None:
    """Print ``text`` or write it to ``output``."""
    if output is None:
        click.echo(text, nl=False)
    else:
        check_output_file(output)
        output.write_text(text, encoding="utf-8")


@bundle.command("export-mllog")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="File for the :::MLLOG lines (default: stdout).")
@click.option("--org", default="unspecified", show_default=True, help="submission_org value.")
@ALLOW_UNVERIFIED
@bundle_input_errors
def bundle_export_mllog(path: Path, output: Path | None, org: str, allow_unverified: bool) -> None:
    """Verify a bundle and write its run as MLPerf-style :::MLLOG lines."""
    from kit.bundle.verified import read_verified_bundle
    from kit.interop.mllog import mllog_text

    _emit(mllog_text(read_verified_bundle(path, allow_unverified), org), output)


@bundle.command("system-desc")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="File for the JSON (default: stdout).")
@click.option("--org", default="unspecified", show_default=True, help="submitter value.")
@ALLOW_UNVERIFIED
@bundle_input_errors
def bundle_system_desc(path: Path, output: Path | None, org: str, allow_unverified: bool) -> None:
    """Verify a bundle and write an MLPerf system description JSON of the nodes it ran on."""
    from kit.bundle.verified import read_verified_bundle
    from kit.interop.system_desc import system_description

    desc = system_description(read_verified_bundle(path, allow_unverified), org)
    _emit(json.dumps(desc, indent=2) + "\n", output)

@cli.command()
@click.argument("bundles", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--baseline", help="Bundle (path or id) the others are related to; it must "
              "have ended ok.")
@click.option("--format", "fmt", type=click.Choice(["table", "markdown", "csv", "json"]),
              default="table", show_default=True)
@ALLOW_UNVERIFIED
@bundle_input_errors
def compare(bundles: tuple[Path, ...], baseline: str | None, fmt: str,
            allow_unverified: bool) -> None:
    """Compare BUNDLES (each verified first; a sweep folder stands for its bundles): metrics
    per configuration, against a baseline, comparability checks.
    """
    from kit.analysis.compare import compare_bundles
    from kit.analysis.compare_format import render_comparison

    out, err = render_comparison(compare_bundles(list(bundles), baseline, allow_unverified,
                                                 markdown=fmt == "markdown"), fmt)
    click.echo(out, nl=False)
    if err:
        click.echo(err, nl=False, err=True)


@cli.command()
@click.argument("bundles", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", "out", type=click.Path(dir_okay=False, path_type=Path),
              required=True, help="Report file to write.")
@click.option("--markdown", is_flag=True,
              help="Write Markdown, with the figures as PNGs in <name>_figures/ beside it.")
@click.option("--single-file", is_flag=True,
              help="HTML with its figures inlined (one file to mail) instead of PNGs in "
              "<name>_figures/ beside it.")
@click.option("--baseline", help="Bundle (path or id) the others are related to; it must "
              "have ended ok.")
@ALLOW_UNVERIFIED
@bundle_input_errors
def report(bundles: tuple[Path, ...], out: Path, markdown: bool, single_file: bool,
           baseline: str | None, allow_unverified: bool) -> None:
    """Write a report on BUNDLES (each verified first; a sweep folder stands for its bundles):
    ranking, checks, figures across configurations and per run (HTML, or Markdown), the
    figures as PNGs in <name>_figures/ beside it unless --single-file.
    """
    from kit.analysis.report import write_report

    check_output_file(out)
    if markdown or not single_file:
        check_output_dir(out.parent / f"{out.stem}_figures")
    from kit.cli.tables import how_to_open

    written = write_report(list(bundles), out, markdown=markdown, single_file=single_file,
                           allow_unverified=allow_unverified, baseline=baseline)
    click.echo(str(written[0].resolve()))
    click.echo(how_to_open(written[0].resolve(), markdown, single_file), err=True)


@cli.command()
@click.argument("bundles", nargs=-1, required=True, type=click.Path(path_type=Path))
@model_options(ProjectionTarget)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True, help="Directory that receives the projection file.")
@click.option("--json", "as_json", is_flag=True, help="JSON output: the projection and its file.")
@bundle_input_errors
def project(bundles: tuple[Path, ...], out: Path, as_json: bool, **opts: object) -> None:
    """Project step time, MFU, power and energy of another layout, scale or micro-batch.

    From measured BUNDLES (runs, ideally profiled; fabric bundles of the platform) to a
    projected-bundle file that compare and report show beside measured ones, marked as
    projected. The last stdout line is its path; see docs/projection.md.
    """
    from kit.projection.show import projection_text, run_projection

    check_output_dir(out)
    target = ProjectionTarget(**opts)  # type: ignore[arg-type]
    proj, path = run_projection(list(bundles), target, out, sys.argv)
    if as_json:
        click.echo(json.dumps({"file": str(path.resolve()), **proj.model_dump(mode="json")}))
        return
    click.echo(projection_text(proj))
    click.echo(str(path.resolve()))


def _fail(message: str, code: int, as_json: bool) -> NoReturn:
    """Exit with ``code`` after ``message``: ``{"error": ...}`` on stdout, else on stderr."""
    if as_json:
        click.echo(json.dumps({"error": message}))
    else:  # a message may quote a hostile name: its escapes must not reach the terminal
        click.echo(f"error: {terminal_safe(message)}", err=True)
    sys.exit(code)


def main() -> None:
    """Console entry point: run the CLI and map errors to exit codes with one-line messages.

    Whether to answer in JSON is read from the raw arguments (``--json`` before any ``--``),
    since a usage error stops click before it has parsed the flag.
    """
    arrow_pandas.keep_out()  # pyarrow would import pandas only to look for its objects
    args = sys.argv[1:] or ["--help"]  # bare `charllm-kit`: what it does, exit 0
    as_json = "--json" in itertools.takewhile(lambda a: a != "--", args)
    try:
        cli.main(args=args, prog_name="charllm-kit", standalone_mode=False)
    except KitInputError as e:
        _fail(str(e), 2, as_json)
    except RunNotPublished as e:
        _fail(str(e), 1, as_json)
    except click.exceptions.Abort:  # Ctrl-C outside a run, which handles its own
        _fail("aborted", 130, as_json)
    except click.ClickException as e:
        _fail(e.format_message(), e.exit_code, as_json)
    except OSError as e:  # a path the user gave that the system will not read or write
        where = f"{e.filename}: " if e.filename else ""
        _fail(f"{where}{e.strerror or e}", 2, as_json)
