"""Redact a bundle's parquet file: its key-value metadata and its string columns.

The kit writes numbers, fixed words (``phase``, ``source``) and the columns' descriptions, so a
file of its own comes out byte for byte as it was. But a parquet footer carries key-value
metadata that any writer can fill (``pandas`` puts its index there, a hand-made file anything),
and the string columns hold whatever was written; both are shared with the bundle. Every key,
value and string goes through the bundle's rules; when one changes, the file is written again,
row group by row group, with the same schema, row groups, values and metadata otherwise.
"""

import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

FIXED_WORDS = frozenset({"warmup", "measured", "gpu", "host"})
"""What the kit writes in its string columns (``phase``, ``source``): kept as they are, since
readers select rows by them, even where a user or host has the same name."""


def _metadata(meta: dict[bytes, bytes] | None,
              text: Callable[[str], str]) -> dict[bytes, bytes] | None:
    """Key-value metadata with every key and value redacted (bytes read as UTF-8)."""
    if not meta:
        return meta
    return {text(k.decode("utf-8", "replace")).encode(): text(v.decode("utf-8", "replace")).encode()
            for k, v in meta.items()}


def _schema(schema: pa.Schema, text: Callable[[str], str]) -> pa.Schema:
    fields = [f.with_metadata(_metadata(f.metadata, text)) if f.metadata else f for f in schema]
    return pa.schema(fields, metadata=_metadata(schema.metadata, text))


def _column(column: pa.ChunkedArray, text: Callable[[str], str]) -> pa.ChunkedArray | None:
    """A string column with each distinct value redacted once; None if none changed."""
    values = pc.unique(column).drop_null().to_pylist()
    changed = {v: v if v in FIXED_WORDS else text(v) for v in values}
    if all(k == v for k, v in changed.items()):
        return None
    keys = pa.array(list(changed))
    return pc.take(pa.array(list(changed.values()), pa.string()),
                   pc.index_in(column, value_set=keys))


def parquet_text(path: Path) -> str:
    """What a parquet file says in words: its metadata's keys and values, and each distinct
    string of its string columns, one a line (for names to be collected from)."""
    with pq.ParquetFile(path) as pf:
        words: list[str] = []
        for meta in [pf.metadata.metadata, *(f.metadata for f in pf.schema_arrow)]:
            words += [b.decode("utf-8", "replace") for kv in (meta or {}).items() for b in kv
                      if kv[0] != b"ARROW:schema"]
        for f in pf.schema_arrow:
            if pa.types.is_string(f.type):
                words += pc.unique(pf.read(columns=[f.name]).column(0)).drop_null().to_pylist()
    return "\n".join(words)


def redact_parquet(src: Path, dest: Path, text: Callable[[str], str]) -> bool:
    """Write ``src`` to ``dest`` with ``text`` applied to its metadata and string columns.

    Returns:
        Whether anything changed (else ``dest`` is a byte copy of ``src``).
    """
    with pq.ParquetFile(src) as pf:
        schema = _schema(pf.schema_arrow, text)
        own = pf.schema_arrow.metadata or {}
        footer = {k: v for k, v in (pf.metadata.metadata or {}).items()
                  if k != b"ARROW:schema" and k not in own}  # beside the Arrow schema's
        redacted = _metadata(footer, text)
        changed = not schema.equals(pf.schema_arrow, check_metadata=True) or redacted != footer
        strings = [i for i, f in enumerate(schema) if pa.types.is_string(f.type)]
        groups = []
        for g in range(pf.num_row_groups):
            table = pf.read_row_group(g)
            for i in strings:
                column = _column(table.column(i), text)
                if column is not None:
                    table, changed = table.set_column(i, schema.field(i), column), True
            groups.append(table)
        if not changed:
            shutil.copyfile(src, dest)
            return False
        with pq.ParquetWriter(dest, schema) as writer:
            for table in groups:
                writer.write_table(pa.Table.from_arrays(table.columns, schema=schema),
                                   row_group_size=max(table.num_rows, 1))
            if redacted:
                writer.add_key_value_metadata(redacted)
    return True
