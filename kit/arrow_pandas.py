"""Keep pandas out of the kit's command-line process: pyarrow imports it only to look.

pyarrow imports pandas whenever it checks whether a value might be a pandas object: a
``pa.array`` or ``pa.scalar`` of Python values, ``pa.Table.from_pylist``, ``pq.read_table``
(through ``pyarrow.dataset``), ``ChunkedArray.to_numpy``, a compute function given a Python
number. The kit hands pyarrow no pandas object and never uses pandas itself (Chakra's tools,
which do, run in the ranks), yet that import was 0.3-0.4 s of CPU in every launcher,
``bundle verify``, ``compare`` and ``report`` on a 2-core host: a third of what ``bundle
verify`` costs. pyarrow takes a failed import for "no pandas" and goes on; its C++ side tries
again at each such check, which a refusal answers at once.

:func:`keep_out` makes ``import pandas`` fail in this process (with a message that names this
module); the CLI calls it first. Processes the kit starts with their own interpreter (ranks,
the sampler) are not affected.
"""

import importlib.abc
import sys

KEPT_OUT = "pandas"


class _KeepOut(importlib.abc.MetaPathFinder):
    """Refuses the import of pandas and its submodules."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == KEPT_OUT or name.startswith(KEPT_OUT + "."):
            raise ModuleNotFoundError(
                f"No module named {name!r}: charllm-kit keeps pandas out of its command-line "
                "process, where only pyarrow's checks for pandas objects would import it "
                "(kit.arrow_pandas)", name=name)


def keep_out() -> None:
    """Refuse ``import pandas`` in this process from now on, unless pandas is imported already
    (then there is nothing left to save)."""
    if KEPT_OUT in sys.modules or any(isinstance(f, _KeepOut) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _KeepOut())
