"""How much memory reading one of a bundle's parquet tables may take, checked before reading.

Parquet compresses a constant column to almost nothing: 27 KB of file can declare 30 million
rows that take 12 GB to decode. So a table's cost is judged from its footer, which states the
row count and each column chunk's decoded page size, before any data page is read; string
columns are then read dictionary-encoded (their cost is the dictionary, whatever the row
count) and their full length is counted before they are expanded.

The limit, :data:`DEFAULT_TABLE_BUDGET_GIB` per table, holds a 4-hour run of 8 devices sampled
every 20 ms about twice over; a site with larger bundles raises it with the environment
variable :data:`BUDGET_ENV` (GiB, e.g. ``CHARLLM_KIT_MAX_TABLE_GIB=16``).
"""

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kit.errors import BundleError, KitInputError

DEFAULT_TABLE_BUDGET_GIB = 2.0
"""Decoded size one table may have, GiB (see the module docstring)."""
BUDGET_ENV = "CHARLLM_KIT_MAX_TABLE_GIB"
"""Environment variable that replaces :data:`DEFAULT_TABLE_BUDGET_GIB`."""


def table_budget_bytes() -> int:
    """The per-table budget in bytes: :data:`BUDGET_ENV` when set, else the default.

    Raises:
        KitInputError: :data:`BUDGET_ENV` is set to something that is not a positive number.
    """
    text = os.environ.get(BUDGET_ENV)
    if text is None:
        return int(DEFAULT_TABLE_BUDGET_GIB * 2**30)
    try:
        gib = float(text)
    except ValueError:
        gib = 0.0
    if not gib > 0 or gib == float("inf"):
        raise KitInputError(f"{BUDGET_ENV}={text!r}: give a positive number of GiB")
    return int(gib * 2**30)


def _fixed_bytes_per_row(schema: pa.Schema) -> int:
    """Bytes a decoded row takes in the fixed-width columns (a validity bit rounded up)."""
    return sum(f.type.bit_width // 8 + 1 for f in schema
               if pa.types.is_primitive(f.type) and f.type.bit_width >= 8)


def _refuse(root: Path, name: str, what: str, size: int, budget: int) -> BundleError:
    return BundleError(
        f"bundle {root}: {name} {what} {size / 2**30:.2f} GiB decoded, over the "
        f"{budget / 2**30:.2f} GiB a table may take ({BUDGET_ENV} raises it); not read")


def check_table_budget(root: Path, name: str, metadata: pq.FileMetaData,
                       expected: pa.Schema) -> None:
    """Refuse a table whose footer says it decodes to more than :func:`table_budget_bytes`.

    Args:
        root: The bundle (for the message).
        name: The file's name in the bundle.
        metadata: The file's parquet footer.
        expected: Its schema (already checked to match).

    Raises:
        BundleError: Rows times the fixed-width columns' size, plus every column chunk's
            decoded page size, is over the budget.
    """
    budget = table_budget_bytes()
    pages = sum(metadata.row_group(g).column(c).total_uncompressed_size
                for g in range(metadata.num_row_groups)
                for c in range(metadata.row_group(g).num_columns))
    size = metadata.num_rows * _fixed_bytes_per_row(expected) + max(pages, 0)
    if size > budget:
        raise _refuse(root, name, f"declares {metadata.num_rows} rows,", size, budget)


def read_within_budget(root: Path, name: str, metadata: pq.FileMetaData,
                       expected: pa.Schema) -> pa.Table:
    """Read a table that passed :func:`check_table_budget`, expanding its strings only when
    their decoded length keeps the table within the budget.

    Raises:
        BundleError: The strings' decoded length takes the table over the budget.
        OSError, pyarrow.ArrowException: The file is corrupt (the caller names it).
    """
    strings = [f.name for f in expected if pa.types.is_string(f.type)]
    table = pq.read_table(root / name, read_dictionary=strings)
    fixed = metadata.num_rows * _fixed_bytes_per_row(expected)
    text = 0
    for column in strings:
        for chunk in table[column].chunks:
            lengths = pc.fill_null(pc.binary_length(chunk.dictionary), 0)
            indices = chunk.indices.drop_null()
            text += pc.sum(pc.take(lengths, indices)).as_py() or 0
    budget = table_budget_bytes()
    if fixed + text > budget:
        raise _refuse(root, name, "has strings that take it to", fixed + text, budget)
    return table.cast(expected)
