"""Classes named by ``"module:Class"`` strings, imported only where they are used.

Telemetry backends, engines and a run kind's progress display are named this way (as
megatron-core's ``ModuleSpec`` names its modules), so the code that names one never imports it:
validating a platform loads no vendor library, an engine's spec never imports its engine, and
the launcher does not import the fabric benchmark it may start.
"""

import importlib
from typing import Any


def import_target(target: str) -> Any:
    """The object a ``"module:Qualified.name"`` string names, its module imported now."""
    module, _, qualname = target.partition(":")
    obj: Any = importlib.import_module(module)
    for attr in qualname.split("."):
        obj = getattr(obj, attr)
    return obj
