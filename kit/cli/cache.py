"""``charllm-kit cache show|clear``: the compile cache (kit.cache.compile_cache) as users see
it, and the ``--compile-cache`` option that ``run`` and ``sweep`` share."""

import os
from collections.abc import Callable
from typing import Any

import click

from kit.cache import compile_cache

CACHE_HELP = (
    "Folder of the compile cache: torch inductor, FX-graph, AOTAutograd and Triton artifacts "
    "kept between runs, in a subfolder keyed by the torch, megatron-core, DeepSpeed, Python and "
    f"kit versions; 'off' for none. Default: ${compile_cache.CACHE_ENV}, else "
    "~/.cache/charllm-kit/compile. `charllm-kit cache show` lists it, `charllm-kit cache "
    "clear` empties it."
)


def compile_cache_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--compile-cache DIR|off``: sets ``$CHARLLM_COMPILE_CACHE`` for the launch (ranks,
    node agents and sweep points inherit it) before the command runs."""

    def apply(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
        if value:
            os.environ[compile_cache.CACHE_ENV] = value

    return click.option("--compile-cache", metavar="DIR|off", expose_value=False,
                        callback=apply, help=CACHE_HELP)(command)


@click.group("cache")
def cache() -> None:
    """The compile cache that makes a sweep's later points start in seconds."""


@cache.command("show")
def cache_show() -> None:
    """Where the compile cache is, and what each keyed folder in it holds."""
    from tabulate import tabulate

    click.echo(tabulate(compile_cache.describe_root(), tablefmt="plain"))


@cache.command("clear")
@click.option("--all", "everything", is_flag=True,
              help="Also this installation's folder (the next run compiles from scratch).")
def cache_clear(everything: bool) -> None:
    """Remove the folders of other torch/megatron-core/kit versions (with --all: every one)."""
    removed = compile_cache.clear(everything)
    for path in removed:
        click.echo(f"removed {path}")
    if not removed:
        click.echo("nothing to remove")
