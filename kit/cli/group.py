"""The top-level command group: a first word that names a workload means ``run WORKLOAD``.

So ``charllm-kit gpt3-tiny --tp 2`` (and ``./run.sh gpt3-tiny --tp 2``, which hands every word
to the CLI) runs it, while every command, the ones added later included, passes through by
name. The commands are the group's own: nothing else keeps a list of them.
"""

import difflib
from pathlib import Path

import click

from kit.paths import workloads_dir

IMPLIED = "run"
"""The command a workload given first stands for."""


def names_workload(word: str) -> bool:
    """Whether ``word`` is a shipped workload's name or a YAML file's path (as ``run`` takes)."""
    if Path(word).suffix in (".yaml", ".yml"):
        return True
    return "/" not in word and (workloads_dir() / f"{word}.yaml").is_file()


class ImpliedRunGroup(click.Group):
    """A click group whose unknown first word, when it names a workload, runs it."""

    def resolve_command(self, ctx: click.Context, args: list[str]
                        ) -> tuple[str | None, click.Command | None, list[str]]:
        """``run`` with every argument for a workload; else a command by name, or one line."""
        word = args[0]
        if word in self.commands or word.startswith("-"):
            return super().resolve_command(ctx, args)
        if names_workload(word):
            return IMPLIED, self.commands[IMPLIED], args
        raise click.UsageError(self._unknown(word), ctx)

    def _unknown(self, word: str) -> str:
        """One line for a word that is neither a command nor a workload, with the nearest."""
        from kit.config.loader import workload_names

        workloads = workload_names()
        close = difflib.get_close_matches(word, [*self.commands, *workloads], n=1)
        if close:
            return f"'{word}' is neither a command nor a workload; did you mean '{close[0]}'?"
        return (f"'{word}' is neither a command nor a workload; commands: "
                f"{', '.join(sorted(self.commands))}; workloads: {', '.join(workloads)}")
