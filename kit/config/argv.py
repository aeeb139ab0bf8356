"""A request model as command-line options: each field's option name, and a model back as argv.

The CLI generates its options from request models (kit/cli/options.py); the launcher writes a
``run`` command line for a batch job from a request (kit/launch/sbatch.py). Both name a field's
option the same way, here: its ``cli`` name, else ``--field-name``.
"""

from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo


def field_extra(info: FieldInfo) -> dict[str, Any]:
    """A field's ``json_schema_extra`` (its ``cli`` name, its ``form``), empty when none."""
    return info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}


def option_flag(name: str, info: FieldInfo) -> str:
    """The option name of a field: its ``cli`` name, else ``--field-name``."""
    return str(field_extra(info).get("cli", "--" + name.replace("_", "-")))


def model_argv(values: BaseModel, skip: tuple[str, ...] = ()) -> list[str]:
    """The options the CLI reads back as ``values``: each field not at its default.

    Fields in ``skip`` are left out (positional arguments, options the caller sets itself).
    """
    argv: list[str] = []
    for name, info in type(values).model_fields.items():
        value = getattr(values, name)
        if name in skip or value == info.default:
            continue
        flag = option_flag(name, info)
        if info.annotation is bool:
            argv.append(flag if value else f"--no-{flag.removeprefix('--')}")
        else:
            argv += [flag, str(value)]
    return argv
