"""How much memory the parquet tables a command reads may take, checked before reading each.

Parquet compresses a constant column to almost nothing: 27 KB of file can declare 30 million
rows that take 12 GB to decode. So a table's cost is judged before any data page is decoded,
from what pyarrow will decode rather than from the footer's totals, which a sender writes
freely: each row group's rows and every page header's decoded size
(:mod:`kit.bundle.parquet_pages`); string columns are then read dictionary-encoded (their cost
is the dictionary, whatever the row count) and their full length is counted before they are
expanded.

One budget covers every reader of a command (``bundle verify``, ``unpack``, ``show``,
``compare``, ``report``): a table is charged :data:`READ_COPIES` times its decoded size, the
most its readers hold at once (``verify`` holds the table as read and as cast; ``show`` and
``compare`` a filtered or converted copy beside them: a 3-million-row steps table of 192 MB
took verify to 382 MB, show to 583 MB and compare to 592 MB, 100 MB of it the kit itself),
on top of what the tables already read still hold (pyarrow's allocations, so ``compare`` of
many bundles shares it). Before 2026-12-07 each table was checked alone, at its decoded size:
a 25-million-row steps table passed ``verify`` at 1.9 GB, then ``show`` reached 3.3 GB and
``compare`` 3.5 GB.

The limit, :data:`DEFAULT_TABLE_BUDGET_GIB`, holds a 4-hour run of 8 devices sampled every
20 ms (5.8 million telemetry rows of 195 bytes decoded and, as in the committed H200 bundle,
25 bytes of pages: 1.2 GiB, charged 3.5 GiB), but not two of them in one ``compare``; a site
with larger bundles raises it with the environment variable :data:`BUDGET_ENV` (GiB, e.g.
``CHARLLM_KIT_MAX_TABLE_GIB=16``).
"""

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kit.bundle.parquet_pages import DecodeCost, decode_cost
from kit.errors import BundleError, KitInputError

DEFAULT_TABLE_BUDGET_GIB = 4.0
"""Memory a command's tables may take, GiB (see the module docstring)."""
READ_COPIES = 3
"""Times its decoded size a table is charged: the copies its readers hold at once."""
BUDGET_ENV = "CHARLLM_KIT_MAX_TABLE_GIB"
"""Environment variable that replaces :data:`DEFAULT_TABLE_BUDGET_GIB`."""


def table_budget_bytes() -> int:
    """The budget in bytes: :data:`BUDGET_ENV` when set, else the default.

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
    """Bytes a decoded row takes in the fixed-width columns (a validity bit rounded up), and
    in each string column's index or offset (4 bytes and its validity)."""
    return sum(f.type.bit_width // 8 + 1 if pa.types.is_primitive(f.type) and
               f.type.bit_width >= 8 else 5 if pa.types.is_string(f.type) else 0
               for f in schema)


def _charge(root: Path, name: str, what: str, size: int, held: int) -> None:
    """Refuse a table of ``size`` decoded bytes when :data:`READ_COPIES` of it, beside the
    ``held`` bytes of tables already read, are over the budget."""
    budget = table_budget_bytes()
    if held + READ_COPIES * size > budget:
        already = f" and the {held / 2**30:.2f} GiB of tables already read" if held > 2**20 \
            else ""
        raise BundleError(
            f"bundle {root}: {name} {what} {size / 2**30:.2f} GiB decoded; {READ_COPIES} times "
            f"that (its readers' copies){already} is over the {budget / 2**30:.2f} GiB a "
            f"command's tables may take ({BUDGET_ENV} raises it); not read")


def check_table_budget(root: Path, name: str, metadata: pq.FileMetaData,
                       expected: pa.Schema) -> DecodeCost:
    """Refuse a table whose row groups and page headers say it decodes to more than
    :func:`table_budget_bytes` (:func:`kit.bundle.parquet_pages.decode_cost`).

    Args:
        root: The bundle (for the message).
        name: The file's name in the bundle.
        metadata: The file's parquet footer.
        expected: Its schema (already checked to match).

    Returns:
        What decoding the file takes.

    Raises:
        BundleError: Rows times the columns' fixed size per row, plus every page's decoded
            size, charged :data:`READ_COPIES` times beside the tables already read, is over
            the budget.
        PagesError: The footer or a page header is corrupt or beyond the page limits.
    """
    cost = decode_cost(root / name, metadata)
    size = cost.rows * _fixed_bytes_per_row(expected) + cost.page_bytes
    _charge(root, name, f"has {cost.rows} rows in {cost.row_groups} row groups,", size,
            pa.total_allocated_bytes())
    return cost


def read_within_budget(root: Path, name: str, cost: DecodeCost,
                       expected: pa.Schema) -> pa.Table:
    """Read a table that passed :func:`check_table_budget`, expanding its strings only when
    their decoded length keeps the table within the budget.

    Raises:
        BundleError: The strings' decoded length takes the table over the budget.
        OSError, pyarrow.ArrowException: The file is corrupt (the caller names it).
    """
    strings = [f.name for f in expected if pa.types.is_string(f.type)]
    held = pa.total_allocated_bytes()
    table = pq.read_table(root / name, read_dictionary=strings)
    fixed = cost.rows * _fixed_bytes_per_row(expected)
    text = 0
    for column in strings:
        for chunk in table[column].chunks:
            lengths = pc.fill_null(pc.binary_length(chunk.dictionary), 0)
            indices = chunk.indices.drop_null()
            text += pc.sum(pc.take(lengths, indices)).as_py() or 0
    _charge(root, name, "has strings that take it to", fixed + text, held)
    return table.cast(expected)
