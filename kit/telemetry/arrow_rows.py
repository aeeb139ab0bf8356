"""Telemetry rows as an Arrow table, built without importing pandas.

pyarrow's ``pa.array``, ``pa.Table.from_pylist`` and ``pa.scalar`` look for pandas objects in
what they are given, and the first look imports pandas: 0.3-0.4 s of CPU in the sampler
process, which never uses it, while the ranks start beside it. The telemetry row's columns
(:data:`~kit.bundle.telemetry_fields.TELEMETRY_SCHEMA`) are float64, int32, int64 and UTF-8 strings,
so each is laid out here in the buffers Arrow defines for it (a validity bitmap, the values, a
string's offsets) with the stdlib :mod:`array`, and pyarrow wraps them as they are.

Values convert as ``pa.Table.from_pylist`` with a schema converts them: an int fills a float64
column, a float in an integer column is truncated toward zero (NaN raises ``ValueError``), a
string or a bool there raises ``TypeError``, an integer out of the column's range
``OverflowError``; a missing key or ``None`` is null.
"""

import array
import operator
from collections.abc import Mapping, Sequence
from itertools import accumulate, repeat
from typing import Any

import numpy as np
import pyarrow as pa

_INT_TYPECODES: dict[pa.DataType, str] = {pa.int64(): "q", pa.int32(): "i"}
"""Arrow integer type -> the :mod:`array` typecode of its values (C int is 4 bytes and long
long 8 on every platform pyarrow is built for)."""


def _validity(values: Sequence[Any]) -> pa.Buffer:
    """Arrow's validity bitmap of ``values``: bit i (least significant first) set where value i
    is not None."""
    present = bytes(map(operator.is_not, values, repeat(None)))
    return pa.py_buffer(np.packbits(np.frombuffer(present, np.uint8), bitorder="little"))


def _integers(values: list[Any]) -> list[Any]:
    """``values`` as an integer column takes them: pyarrow truncates a float, refuses a bool."""
    kinds = set(map(type, values))
    if bool in kinds:
        raise TypeError("expected an int for an integer column, got bool")
    if float in kinds:
        return [int(v) if isinstance(v, float) else v for v in values]
    return values


def column(values: Sequence[Any], dtype: pa.DataType) -> pa.Array:
    """One Arrow array of type ``dtype`` (float64, int32, int64 or string) holding ``values``.

    Raises:
        TypeError: Another type, or a value the column cannot hold.
        ValueError: NaN in an integer column.
        OverflowError: An integer out of the column's range.
    """
    values = list(values)
    nulls = values.count(None)
    if nulls and nulls == len(values):
        return pa.nulls(len(values), dtype)
    validity = _validity(values) if nulls else None
    fill = "" if dtype == pa.string() else 0
    present = [fill if v is None else v for v in values] if nulls else values
    if dtype == pa.string():
        encoded = list(map(str.encode, present))  # TypeError for anything but a str
        offsets = array.array("i", accumulate(map(len, encoded), initial=0))
        buffers = [validity, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    elif dtype == pa.float64():
        buffers = [validity, pa.py_buffer(array.array("d", present))]
    elif dtype in _INT_TYPECODES:
        buffers = [validity, pa.py_buffer(array.array(_INT_TYPECODES[dtype], _integers(present)))]
    else:
        raise TypeError(f"no row column of Arrow type {dtype} (float64, int32, int64, string)")
    return pa.Array.from_buffers(dtype, len(values), buffers, null_count=nulls)


def table_from_rows(rows: Sequence[Mapping[str, Any]], schema: pa.Schema) -> pa.Table:
    """The table of ``schema`` (its field metadata kept) holding ``rows``, as
    ``pa.Table.from_pylist(rows, schema=schema)`` builds it: keys not in the schema are
    ignored, a missing key is null.

    Raises:
        TypeError, ValueError, OverflowError: As :func:`column` raises them.
    """
    return pa.Table.from_arrays([column([row.get(name) for row in rows], dtype)
                                 for name, dtype in zip(schema.names, schema.types, strict=True)],
                                schema=schema)
