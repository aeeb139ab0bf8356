"""The ``charllm-kit`` command line: click commands that parse, call one function and print.

Exit codes: 0 ok; 1 the run failed (its bundle is still written); 2 bad input, reported as one
line on stderr.
"""

import json
import sys
from pathlib import Path

import click

from kit.container import RUNTIMES
from kit.errors import KitInputError, RunNotPublished
from kit.output_target import check_output_dir, check_output_file

POSITIVE = click.IntRange(min=1)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="charllm-kit")
def cli() -> None:
    """Characterize distributed LLM training: performance, power and thermals."""


@cli.command()
@click.argument("workload")
@click.option("--platform", help="Platform name or YAML (default: detect this host).")
@click.option("--engine", type=click.Choice(["megatron", "deepspeed"]), default="megatron",
              show_default=True)
@click.option("--nodes", type=POSITIVE, default=1, show_default=True,
              help="Nodes (a real run: one node; more resolve with --dry-run).")
@click.option("--launcher", type=click.Choice(["local", "slurm"]), default="local",
              show_default=True, help="slurm is not available yet (refused).")
@click.option("--tp", type=POSITIVE, default=1, show_default=True, help="Tensor parallel degree.")
@click.option("--pp", type=POSITIVE, default=1, show_default=True, help="Pipeline parallel degree.")
@click.option("--dp", type=POSITIVE, help="Data parallel degree (default: derived).")
@click.option("--ep", type=POSITIVE, default=1, show_default=True, help="Expert parallel degree.")
@click.option("--cp", type=POSITIVE, default=1, show_default=True, help="Context parallel degree.")
@click.option("--vpp", type=POSITIVE, help="Virtual pipeline stages per rank.")
@click.option("--sp", is_flag=True, help="Sequence parallelism (needs --tp > 1).")
@click.option("--moe-dispatcher", type=click.Choice(["alltoall", "allgather"]),
              default="alltoall", show_default=True, help="MoE token dispatcher.")
@click.option("--micro-batch", type=POSITIVE, help="Samples per micro-batch (default: workload's).")
@click.option("--global-batch", type=POSITIVE, help="Samples per step (default: workload's).")
@click.option("--recompute", type=click.Choice(["none", "selective", "full"]), default="none",
              show_default=True)
@click.option("--recompute-method", type=click.Choice(["uniform", "block"]), default="uniform",
              show_default=True, help="Which layers full recompute checkpoints.")
@click.option("--overlap/--no-overlap", default=False, help="Overlap grad reduce/param gather.")
@click.option("--dist-optimizer", is_flag=True, help="Shard optimizer states over DP.")
@click.option("--fsdp", is_flag=True,
              help="megatron-core's Megatron-FSDP: shard weights, grads and optimizer over DP.")
@click.option("--zero", type=click.IntRange(0, 3), default=0, show_default=True,
              help="DeepSpeed ZeRO stage.")
@click.option("--offload", is_flag=True, help="DeepSpeed: optimizer states and step on the host.")
@click.option("--steps", type=POSITIVE, default=20, show_default=True, help="Measured steps.")
@click.option("--warmup", type=click.IntRange(min=0), default=3, show_default=True,
              help="Unmeasured steps first.")
@click.option("--telemetry-interval-ms", type=click.IntRange(min=0), default=20,
              show_default=True, help="Sampling period; 0 turns telemetry off.")
@click.option("--profile", is_flag=True, help="Record a kernel profile of one step.")
@click.option("--seed", type=int, default=1234, show_default=True)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True, help="Directory that receives the bundle.")
@click.option("--dry-run", is_flag=True,
              help="Resolve, validate and estimate memory only; launch nothing.")
@click.option("--force", is_flag=True,
              help="Run even if the memory estimate predicts it will not fit.")
@click.option("--json", "as_json", is_flag=True,
              help="JSON output: the resolved plan, the run's status and summary, or the error.")
def run(workload: str, out: Path, dry_run: bool, force: bool, as_json: bool,
        **opts: object) -> None:
    """Train WORKLOAD on every rank, sample telemetry, and write one result bundle.

    A run predicted not to fit in device memory (see --dry-run) is refused unless --force.
    """
    from kit.analysis.memory import ensure_fits, estimate_memory
    from kit.analysis.tables import print_dry_run, print_summary
    from kit.spec.resolve import resolve, run_request

    opts["micro_batch_size"] = opts.pop("micro_batch")
    opts["global_batch_size"] = opts.pop("global_batch")
    try:
        cfg = resolve(run_request(workload=workload, **opts), require_present=not dry_run)
        memory = estimate_memory(cfg)
        if not (dry_run or force):
            ensure_fits(memory)
    except KitInputError as e:
        if as_json:
            click.echo(json.dumps({"error": str(e)}))
            sys.exit(2)
        raise
    if dry_run:
        print_dry_run(cfg, as_json, memory)
        return
    check_output_dir(out)
    from kit.container.detect import container_record, shm_hint
    from kit.launch.session import run_session

    hint = shm_hint(container_record())
    if hint:
        click.echo(f"warning: {hint}", err=True)

    result = run_session(cfg, out, command=sys.argv)
    if as_json:
        click.echo(json.dumps({"status": result.status, "error": result.error,
                               "bundle": str(result.bundle.resolve()),
                               "summary": result.summary}))
    else:
        print_summary(result)
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
def sweep(sweep_file: Path, dry_run: bool, resume: bool, out: Path) -> None:
    """Run every valid point of SWEEP_FILE (YAML), one bundle each; see docs/sweeps.md."""
    from kit.sweep.spec import load_sweep
    from kit.sweep.tables import plan_table, summary_table

    spec = load_sweep(sweep_file)
    check_output_dir(out)
    if dry_run:
        from kit.sweep.plan import plan_sweep

        click.echo(plan_table(plan_sweep(spec, require_present=False)))
        click.echo("dry run: nothing launched")
        return
    from kit.sweep.runner import run_sweep

    outcome = run_sweep(spec, sweep_file, out, resume, command=sys.argv)
    click.echo(summary_table(outcome.index))
    click.echo(str(outcome.folder.resolve()))
    if outcome.any_failed:
        sys.exit(1)


@cli.group()
def workloads() -> None:
    """Shipped workloads."""


@workloads.command("list")
def workloads_list() -> None:
    """List shipped workloads."""
    from kit.analysis.tables import workloads_table

    click.echo(workloads_table())


@workloads.command("show")
@click.argument("name")
def workloads_show(name: str) -> None:
    """Show one workload's architecture (NAME or a YAML path)."""
    from kit.analysis.tables import show_workload

    click.echo(show_workload(name))


@cli.group()
def platforms() -> None:
    """Shipped platform profiles."""


@platforms.command("list")
def platforms_list() -> None:
    """List shipped platforms."""
    from kit.analysis.tables import platforms_table

    click.echo(platforms_table())


@platforms.command("show")
@click.argument("name")
def platforms_show(name: str) -> None:
    """Show one platform profile (NAME or a YAML path)."""
    from kit.analysis.tables import show_platform

    click.echo(show_platform(name))


@platforms.command("detect")
def platforms_detect() -> None:
    """Print which platform this host is."""
    from kit.spec.detect import detect_platform, local_accelerator_names

    spec = detect_platform()
    devices = ", ".join(local_accelerator_names()) or "no accelerators"
    click.echo(f"{spec.name}\t{spec.device_name} ({devices})")


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
def bundle_show(path: Path) -> None:
    """Summarize one bundle."""
    from kit.bundle.reader import read_bundle
    from kit.bundle.show import format_bundle

    click.echo(format_bundle(read_bundle(path)))


@bundle.command("verify")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
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
    reason. Refused while the launcher or its ranks still run.
    """
    from kit.bundle.recover import recover_bundle
    from kit.bundle.verify import verify_bundle

    bundle_path = recover_bundle(path)
    verify_bundle(bundle_path)
    click.echo(str(bundle_path.resolve()))


@bundle.command("pack")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Archive to write (default: ./<bundle>.tar.gz).")
@click.option("--redact", is_flag=True, help="Remove host names, user names and IPs first.")
def bundle_pack(path: Path, output: Path | None, redact: bool) -> None:
    """Verify a bundle and pack it into one .tar.gz; print the archive path."""
    from kit.bundle.pack import pack_bundle

    click.echo(str(pack_bundle(path, output, redact=redact)))


@bundle.command("unpack")
@click.argument("archive", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path),
              default=Path("."), help="Directory that receives the bundle (default: .).")
def bundle_unpack(archive: Path, output: Path) -> None:
    """Unpack an archive from anyone safely, verify it; print the bundle path."""
    from kit.bundle.unpack import unpack_bundle

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
def bundle_export_mllog(path: Path, output: Path | None, org: str) -> None:
    """Write a bundle's run as MLPerf-style :::MLLOG lines."""
    from kit.bundle.reader import read_bundle
    from kit.interop.mllog import mllog_text

    _emit(mllog_text(read_bundle(path), org), output)


@bundle.command("system-desc")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="File for the JSON (default: stdout).")
@click.option("--org", default="unspecified", show_default=True, help="submitter value.")
def bundle_system_desc(path: Path, output: Path | None, org: str) -> None:
    """Write an MLPerf system description JSON of the nodes a bundle ran on."""
    from kit.bundle.reader import read_bundle
    from kit.interop.system_desc import system_description

    desc = system_description(read_bundle(path).manifest, org)
    _emit(json.dumps(desc, indent=2) + "\n", output)

@cli.command()
@click.argument("bundles", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--baseline", help="Bundle (path or id) the ratios are against.")
@click.option("--format", "fmt", type=click.Choice(["table", "markdown", "csv", "json"]),
              default="table", show_default=True)
def compare(bundles: tuple[Path, ...], baseline: str | None, fmt: str) -> None:
    """Compare BUNDLES: canonical metrics per configuration, ratios, comparability checks."""
    from kit.analysis.compare import compare_bundles
    from kit.analysis.compare_format import render_comparison

    out, err = render_comparison(compare_bundles(list(bundles), baseline), fmt)
    click.echo(out, nl=False)
    if err:
        click.echo(err, nl=False, err=True)


@cli.command()
@click.argument("bundles", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("-o", "--output", "out", type=click.Path(dir_okay=False, path_type=Path),
              required=True, help="Report file to write.")
@click.option("--markdown", is_flag=True,
              help="Write Markdown, with the figures as PNGs in <name>_figures/ beside it.")
def report(bundles: tuple[Path, ...], out: Path, markdown: bool) -> None:
    """Write a report on BUNDLES: comparison, checks and figures (self-contained HTML)."""
    from kit.analysis.report import write_report

    check_output_file(out)
    if markdown:
        check_output_dir(out.parent / f"{out.stem}_figures")
    written = write_report(list(bundles), out, markdown=markdown)
    click.echo(str(written[0].resolve()))


def main() -> None:
    """Console entry point: run the CLI and map errors to exit codes with one-line messages."""
    try:
        cli.main(standalone_mode=False)
    except KitInputError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    except RunNotPublished as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        click.echo(f"error: {e.format_message()}", err=True)
        sys.exit(e.exit_code)
    except OSError as e:  # a path the user gave that the system will not read or write
        where = f"{e.filename}: " if e.filename else ""
        click.echo(f"error: {where}{e.strerror or e}", err=True)
        sys.exit(2)
