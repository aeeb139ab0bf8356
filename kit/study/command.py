"""``charllm-kit study``: parse, plan or run the study (kit.study.run), print the verdicts."""

import sys
from pathlib import Path

import click

from kit.study.catalog import FINDING_IDS


def _only(value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip()) if value else ()


@click.command()
@click.option("--quick", is_flag=True,
              help="The short form: fewer points and steps (about 6 minutes on 4 H200s by the "
              "estimate; --dry-run --quick gives this node's).")
@click.option("--dry-run", is_flag=True,
              help="List the points, the findings each serves and the estimated time; run none.")
@click.option("--resume", is_flag=True,
              help="Continue the study folder: keep points whose bundle verifies.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("results"),
              show_default=True, help="Directory that receives the study folder "
              "<out>/study-<platform>x<devices>[-quick]/.")
@click.option("--platform", help="Platform name (default: detect this node; another one only "
              "with --dry-run).")
@click.option("--devices", type=int,
              help="Devices the study uses: 1, 2, 4 or 8 (default: every visible one; the "
              "platform's per node when named; 2 rank processes on cpu).")
@click.option("--only", metavar="FINDINGS",
              help=f"Run only the points of these findings (comma-separated: "
              f"{', '.join(FINDING_IDS)}).")
def study(quick: bool, dry_run: bool, resume: bool, out: Path, platform: str | None,
          devices: int | None, only: str | None) -> None:
    """Run the reference study's node-sized matrix here, then report its findings.

    Each finding of the study (Go et al., MICRO 2025) gets this node's numbers, a verdict
    (agrees / disagrees / not measurable here) and the bundles it rests on, in
    <folder>/<node>-findings.json and first in <folder>/report.html. The last stdout line is
    the study folder; see docs/study.md.
    """
    from rich.console import Console

    from kit.output_target import check_output_dir
    from kit.study.matrix import build_matrix, detect_node
    from kit.study.render import findings_table
    from kit.study.run import plan_study, plan_text, run_study

    matrix = build_matrix(detect_node(platform, devices), quick, _only(only))
    planned = plan_study(matrix, require_present=not dry_run, out=out)
    if dry_run:
        click.echo(plan_text(planned))
        return
    check_output_dir(out)
    console = Console(stderr=True, highlight=False)
    outcome = run_study(planned, out, resume, sys.argv,
                        lambda line: console.print(line, markup=False, soft_wrap=True))
    click.echo(findings_table(outcome.findings))
    click.echo(f"findings: {outcome.findings_file}")
    if outcome.report is not None:
        click.echo(f"report: {outcome.report}")
    click.echo(str(outcome.folder.resolve()))
    if outcome.any_failed:
        sys.exit(1)
