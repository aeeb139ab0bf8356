"""``charllm-kit study``: parse, plan or run the study (kit.study.run), or conclude from bundles
that exist (kit.study.existing), print the verdicts."""

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from kit.errors import KitInputError
from kit.study.catalog import FINDING_IDS

if TYPE_CHECKING:
    from kit.study.run import StudyOutcome


def _only(value: str | None) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip()) if value else ()


_RUN_ONLY = ("quick", "dry_run", "resume", "platform", "devices", "only")
"""Options that shape a run of the matrix, which ``--from`` does not make."""


def _say(line: str) -> None:
    """A progress line on stderr."""
    from rich.console import Console

    Console(stderr=True, highlight=False).print(line, markup=False, soft_wrap=True)


def _from_bundles(from_: tuple[Path, ...], more: tuple[Path, ...], allow_unverified: bool,
                  out: Path, given: dict[str, object]) -> "StudyOutcome":
    """``study --from``: check the options, then conclude from the bundles."""
    if not from_ and more:
        raise KitInputError(f"unexpected argument {more[0]}: the bundles to conclude from "
                            "follow --from")
    if not from_:
        raise KitInputError("--allow-unverified applies to bundles read with --from; the "
                            "study's own runs are verified as they are kept")
    run_only = [f"--{k.replace('_', '-')}" for k in _RUN_ONLY if given[k]]
    if run_only:
        raise KitInputError(f"study --from runs nothing, so it takes no {', '.join(run_only)}")
    from kit.output_target import check_output_dir
    from kit.study.existing import conclude_existing

    check_output_dir(out)
    return conclude_existing([*from_, *more], out, allow_unverified, _say)


def _echo(outcome: "StudyOutcome") -> None:
    """The verdicts, the files written and, last, the folder."""
    from kit.study.render import findings_table

    click.echo(findings_table(outcome.findings))
    click.echo(f"findings: {outcome.findings_file}")
    if outcome.report is not None:
        click.echo(f"report: {outcome.report}")
    click.echo(str(outcome.folder.resolve()))


@click.command()
@click.argument("more", nargs=-1, type=click.Path(path_type=Path), metavar="[MORE...]")
@click.option("--from", "from_", multiple=True, type=click.Path(path_type=Path),
              metavar="BUNDLE_OR_FOLDER",
              help="Run nothing: write the findings and report of these bundles into "
              "<out>/study-<node>-from-bundles/ (a sweep, study or results folder stands for "
              "the bundles in it; repeat --from, or give more paths after it).")
@click.option("--allow-unverified", is_flag=True,
              help="With --from: use a bundle that fails verification, marked as unverified, "
              "instead of refusing it.")
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
def study(more: tuple[Path, ...], from_: tuple[Path, ...], allow_unverified: bool, quick: bool,
          dry_run: bool, resume: bool, out: Path, platform: str | None, devices: int | None,
          only: str | None) -> None:
    """Run the reference study's node-sized matrix here, then report its findings.

    Each finding of the study (Go et al., MICRO 2025) gets this node's numbers, a verdict
    (agrees / disagrees / confounded / not measurable here) and the bundles it rests on, in
    <folder>/<node>-findings.json and first in <folder>/report.html. With --from, the same for
    bundles that exist, running nothing. The last stdout line is the study folder; see
    docs/study.md.
    """
    if from_ or more or allow_unverified:
        _echo(_from_bundles(from_, more, allow_unverified, out,
                            click.get_current_context().params))
        return
    from rich.console import Console

    from kit.output_target import check_output_dir
    from kit.study.matrix import build_matrix, detect_node
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
    _echo(outcome)
    if outcome.any_failed:
        sys.exit(1)
