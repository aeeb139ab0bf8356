"""Click options generated from a pydantic model, so a run's options are defined once.

Each field of :class:`~kit.plan.resolve.RunRequest` but those given as arguments becomes an
option: ``--field-name`` (or the field's ``cli`` name), its description as the help, its default
shown, a ``Literal`` as a choice, a bounded int as a range, a text pattern as a check that names
the field's ``form``, a bool as a ``--x/--no-x`` pair.
The values come back under the field names, ready for ``RunRequest(**values)``;
:func:`kit.config.argv.model_argv` turns a model back into the options that give it (``submit``
writes ``run``'s command line with it).
"""

import re
import types
import typing
from collections.abc import Callable
from typing import Any, Literal

import annotated_types
import click
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from kit.config.argv import field_extra, option_flag


class Integer(click.IntRange):
    """An int option within bounds whose error says which numbers it takes, in words."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        """The value as an int; else one line: "'abc' is not a positive integer"."""
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter:
            self.fail(f"{value!r} is not {self.described()}", param, ctx)

    def described(self) -> str:
        """What the option takes: "a positive integer", "an integer from 0 to 3", ..."""
        if self.min is not None and self.max is not None:
            return f"an integer from {self.min} to {self.max}"
        if self.min == 1:
            return "a positive integer"
        if self.min == 0:
            return "a non-negative integer"
        return f"an integer >= {self.min}" if self.min is not None else "an integer"


class Matching(click.ParamType):
    """A text option that must match its field's pattern; the error shows the expected form."""

    name = "text"

    def __init__(self, pattern: str, form: str) -> None:
        self.pattern, self.form = pattern, form

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        """The value when it matches; else one line naming the form, e.g. "A:B or A"."""
        if not re.fullmatch(self.pattern, str(value)):
            self.fail(f"{value!r} is not of the form {self.form}", param, ctx)
        return value


def _option_type(info: FieldInfo) -> Any:
    """The click type of a field: a choice, an int range from its bounds (``gt``/``ge`` and
    ``le``), a text pattern (its
    ``form`` says it in words), or a plain type."""
    annotation = info.annotation
    if typing.get_origin(annotation) is Literal:
        values = typing.get_args(annotation)
        if all(isinstance(v, int) for v in values):
            return Integer(min(values), max(values))
        return click.Choice([str(v) for v in values])
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    base = args[0] if isinstance(annotation, types.UnionType) and args else annotation
    if base is int:
        low = next((m.gt + 1 for m in info.metadata if isinstance(m, annotated_types.Gt)),
                   next((m.ge for m in info.metadata if isinstance(m, annotated_types.Ge)), None))
        high = next((m.le for m in info.metadata if isinstance(m, annotated_types.Le)), None)
        return Integer(min=low, max=high)
    pattern = next((m.pattern for m in info.metadata if getattr(m, "pattern", None)), None)
    if base is str and pattern:
        return Matching(pattern, str(field_extra(info).get("form", pattern)))
    return base


def model_options(
    model: type[BaseModel], skip: tuple[str, ...] = ()
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator adding one click option per field of ``model`` (fields in ``skip`` left out).

    A field whose allowed values are only known at run time (the registered engines) is plain
    text, checked where it is resolved.
    """

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for name, info in reversed(list(model.model_fields.items())):
            if name in skip:
                continue
            flag = option_flag(name, info)
            kwargs: dict[str, Any] = {"help": info.description}
            if info.annotation is bool:  # --x/--no-x: a sweep's default can be overridden
                flag = f"{flag}/--no-{flag.removeprefix('--')}"
                kwargs.update(is_flag=True, default=bool(info.default))
            else:
                kwargs.update(type=_option_type(info),
                              default=info.default, show_default=info.default is not None)
            command = click.option(flag, name, **kwargs)(command)
        return command

    return decorate
