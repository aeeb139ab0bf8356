"""The last line of defence of the commands that read bundles from other sites.

A bundle that verifies has passed its schema, but the schema leaves the record of what ran
(``config``, ``workload``, ``platform``, per-rank detail) free-form: a sender can put a null
where the kit wrote a name, or a string where it wrote a number, and the analysis that trusts
the kit's own layout meets a ``TypeError`` deep inside. :func:`bundle_input_errors` turns such
an error into one :class:`~kit.errors.BundleError` line (exit 2) instead of a traceback, and
so does a ``MemoryError`` (pyarrow's included) that the read budget (:mod:`kit.bundle.budget`)
did not foresee.
"""

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from kit.errors import BundleError

P = ParamSpec("P")
R = TypeVar("R")

SHAPE_ERRORS = (TypeError, KeyError, AttributeError, IndexError, ValueError, ArithmeticError,
                RecursionError, StopIteration)
"""What Python raises when a value has another type or shape than the code expects (a
``StopIteration``: a search of the bundle's own lists found nothing)."""


def bundle_input_errors(command: Callable[P, R]) -> Callable[P, R]:
    """Wrap a command that reads bundles: a shape error from their contents, or running out
    of memory on them, is bad input."""

    @functools.wraps(command)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except MemoryError as e:  # pyarrow.ArrowMemoryError is one; the budget should prevent it
            from kit.bundle.budget import BUDGET_ENV  # here: the CLI starts without pyarrow

            raise BundleError(
                f"out of memory reading the bundles given ({type(e).__name__}: "
                f"{str(e)[:200]}); {BUDGET_ENV} sets how much their tables may take") from None
        except SHAPE_ERRORS as e:
            what = str(e) if not isinstance(e, RecursionError) else "nested too deeply"
            raise BundleError(
                f"a bundle given holds a value this kit cannot use ({type(e).__name__}: "
                f"{what[:200]}): it passes the schema but is not laid out as the kit writes "
                "bundles; was it edited?") from None

    return guarded
