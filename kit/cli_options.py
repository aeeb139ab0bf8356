"""Click options generated from a pydantic model, so a run's options are defined once.

Each field of :class:`~kit.spec.resolve.RunRequest` but those given as arguments becomes an
option: ``--field-name`` (or the field's ``cli`` name), its description as the help, its default
shown, a ``Literal`` as a choice, a bounded int as a range, a bool as a ``--x/--no-x`` pair.
The values come back under the field names, ready for ``RunRequest(**values)``;
:func:`model_argv` turns a model back into the options that give it (``submit`` writes ``run``'s
command line with it).
"""

import types
import typing
from collections.abc import Callable
from typing import Any, Literal

import annotated_types
import click
from pydantic import BaseModel
from pydantic.fields import FieldInfo


def _option_type(info: FieldInfo) -> Any:
    """The click type of a field: a choice, an int range from its bounds, or a plain type."""
    annotation = info.annotation
    if typing.get_origin(annotation) is Literal:
        values = typing.get_args(annotation)
        if all(isinstance(v, int) for v in values):
            return click.IntRange(min(values), max(values))
        return click.Choice([str(v) for v in values])
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    base = args[0] if isinstance(annotation, types.UnionType) and args else annotation
    if base is int:
        low = next((m.gt + 1 for m in info.metadata if isinstance(m, annotated_types.Gt)),
                   next((m.ge for m in info.metadata if isinstance(m, annotated_types.Ge)), None))
        return click.IntRange(min=low) if low is not None else int
    return base


def _flag(name: str, info: FieldInfo) -> str:
    """The option name of a field: its ``cli`` name, else ``--field-name``."""
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    return str(extra.get("cli", "--" + name.replace("_", "-")))


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
            flag = _flag(name, info)
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


def model_argv(values: BaseModel, skip: tuple[str, ...] = ()) -> list[str]:
    """The options :func:`model_options` reads back as ``values``: each field not at its default.

    Fields in ``skip`` are left out (positional arguments, options the caller sets itself).
    """
    argv: list[str] = []
    for name, info in type(values).model_fields.items():
        value = getattr(values, name)
        if name in skip or value == info.default:
            continue
        flag = _flag(name, info)
        if info.annotation is bool:
            argv.append(flag if value else f"--no-{flag.removeprefix('--')}")
        else:
            argv += [flag, str(value)]
    return argv
