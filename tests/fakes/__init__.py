"""Fakes of vendor libraries that cannot run on a CPU host, at their import boundary only.

``tests/fakes/nvml/pynvml.py`` and ``tests/fakes/amdsmi/amdsmi/`` stand in for nvidia-ml-py and
AMD SMI's ``amdsmi`` package: the kit's real backends import them by the real names and run
unchanged. Each fake answers with the shapes the library documents (cited in the fake) and reads
the node it pretends to be from a JSON scenario named by an environment variable, so the same
scenario drives a source built in the test process and one built in the sampler's own (spawned)
process, which inherits the environment and ``sys.path``.
"""

import importlib
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

FAKES = Path(__file__).resolve().parent

NVML_SCENARIO_ENV = "CHARLLM_FAKE_NVML_SCENARIO"
"""Names the JSON scenario of the fake ``pynvml``."""

AMDSMI_SCENARIO_ENV = "CHARLLM_FAKE_AMDSMI_SCENARIO"
"""Names the JSON scenario of the fake ``amdsmi``."""

_ROOTS = {"pynvml": (FAKES / "nvml", NVML_SCENARIO_ENV),
          "amdsmi": (FAKES / "amdsmi", AMDSMI_SCENARIO_ENV)}


def _own(name: str) -> list[str]:
    return [k for k in sys.modules if k == name or k.startswith(name + ".")]


@contextmanager
def fake_library(
    monkeypatch: pytest.MonkeyPatch, name: str, scenario: dict[str, Any], tmp_path: Path
) -> Iterator[ModuleType]:
    """Make ``import NAME`` give the fake, driven by ``scenario``, in this process and in
    processes it spawns; restore the real one (or its absence) afterwards.

    Args:
        monkeypatch: The test's monkeypatch (restores the environment and ``sys.path``).
        name: ``"pynvml"`` or ``"amdsmi"``.
        scenario: The node the fake pretends to be (see each fake's docstring).
        tmp_path: Where the scenario file is written.
    """
    root, env = _ROOTS[name]
    path = tmp_path / f"{name}-scenario.json"
    path.write_text(json.dumps(scenario))
    monkeypatch.setenv(env, str(path))
    saved = {k: sys.modules.pop(k) for k in _own(name)}
    monkeypatch.syspath_prepend(str(root))
    try:
        yield importlib.import_module(name)
    finally:
        for k in _own(name):
            del sys.modules[k]
        sys.modules.update(saved)
