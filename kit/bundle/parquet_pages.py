"""What decoding a parquet file will take, from its page headers rather than its footer's sums.

A footer's totals are claims a sender writes freely: a 178 KB file whose footer said
``num_rows=1`` held 12 row groups of 5 million rows, and one whose column chunks declared
``total_uncompressed_size=1`` pointed ten row groups at one shared 300 MB dictionary page. So the
cost of a table is counted from what pyarrow will actually decode: each row group's own row
count, and every page header of every column chunk, walked over the byte range pyarrow reads
(each page declares the size pyarrow allocates to decompress it). The walk reads only the
headers, a few hundred bytes per page.

Refused as beyond a limit (:class:`PagesLimit`): a footer over :data:`MAX_FOOTER_BYTES` (read
before pyarrow parses it: 200,000 row groups in 788 KB of archive made it abort in
``std::bad_alloc``), over :data:`MAX_ROW_GROUPS` row groups or :data:`MAX_PAGES` pages, a
dictionary page over :data:`MAX_DICTIONARY_PAGE_BYTES`. Refused as corrupt
(:class:`PagesError`): a row count the row groups do not add up to, a column chunk whose pages
hold another number of values than its row group has rows, a chunk outside the file, more
than one dictionary page in a chunk, a page header that does not parse.
"""

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pyarrow.parquet as pq

from kit.bundle.thrift_compact import (
    I32,
    STRUCT,
    CompactReader,
    ThriftError,
    ThriftTruncated,
)

MAX_FOOTER_BYTES = 16 * 2**20
"""Largest footer read: the kit's tables have one row group and a footer of a few KB."""
MAX_ROW_GROUPS = 1024
"""Most row groups in a table: pyarrow writes one per million rows (the kit: one per table)."""
MAX_PAGES = 200_000
"""Most pages in a table: pyarrow writes one per 1 MiB or 20,000 values of a column."""
MAX_DICTIONARY_PAGE_BYTES = 64 * 2**20
"""Largest decoded dictionary page: pyarrow stops a dictionary at 1 MiB by default."""
MAX_PAGE_HEADER_BYTES = 1 * 2**20
"""Largest page header (pyarrow keeps a page's statistics under 4 KiB)."""

_DATA_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2 = 0, 2, 3
_HEADER_PEEK = 1024
"""Bytes read for a page header first (they take a few dozen; more are read when needed)."""


class PagesError(ValueError):
    """A parquet file whose footer or page headers are corrupt."""


class PagesLimit(PagesError):
    """A parquet file beyond one of the limits above."""


@dataclass(frozen=True)
class DecodeCost:
    """What decoding a whole file takes, as its row groups and page headers say.

    Attributes:
        rows: Rows of all row groups.
        page_bytes: Decoded size of every page of every column chunk, bytes (a page shared
            by several chunks counted once per chunk: pyarrow decodes it once per chunk).
        row_groups: How many row groups.
    """

    rows: int
    page_bytes: int
    row_groups: int


def read_footer(path: Path) -> pq.FileMetaData:
    """The file's footer, after checking its declared length against the file and
    :data:`MAX_FOOTER_BYTES`.

    Raises:
        PagesError: Not parquet, or (:class:`PagesLimit`) a footer over the limit.
        OSError, pyarrow.ArrowException: As pyarrow raises for a footer it cannot parse.
    """
    size = path.stat().st_size
    with path.open("rb") as f:
        if size < 12:
            raise PagesError("shorter than a parquet file")
        f.seek(size - 8)
        tail = f.read(8)
    length, magic = struct.unpack("<I4s", tail)
    if magic != b"PAR1":
        raise PagesError("no parquet magic at its end")
    if length > size - 12:
        raise PagesError(f"a footer of {length} bytes in a file of {size}")
    if length > MAX_FOOTER_BYTES:
        raise PagesLimit(f"a footer of {length} bytes, over the {MAX_FOOTER_BYTES} read")
    return pq.read_metadata(path)


def _header(f: BinaryIO, pos: int, end: int) -> tuple[dict, int]:
    """The page header at ``pos`` (before ``end``) and its length in bytes."""
    for peek in (_HEADER_PEEK, MAX_PAGE_HEADER_BYTES):
        want = min(peek, end - pos)
        f.seek(pos)
        reader = CompactReader(f.read(want))
        try:
            return reader.read_struct(), reader.pos
        except ThriftTruncated:
            if want < peek or peek == MAX_PAGE_HEADER_BYTES:
                raise PagesError(f"a page header at byte {pos} runs past its column chunk or "
                                 f"over {MAX_PAGE_HEADER_BYTES} bytes") from None
        except ThriftError as e:
            raise PagesError(f"a page header at byte {pos} is unreadable ({e})") from None
    raise AssertionError("unreachable: the last peek returns or raises")


def _int(fields: dict, field: int, what: str) -> int:
    kind, value = fields.get(field, (None, None))
    if kind != I32 or value < 0:
        raise PagesError(f"a page header without a valid {what}")
    return value


def _values(header: dict, page_type: int) -> int:
    """Values a data or dictionary page holds (its own header's ``num_values``)."""
    field = {_DATA_PAGE: 5, _DICTIONARY_PAGE: 7, _DATA_PAGE_V2: 8}.get(page_type)
    if field is None:
        return 0  # an index page: skipped by readers
    kind, inner = header.get(field, (None, None))
    if kind != STRUCT:
        raise PagesError(f"a page of type {page_type} without its header")
    return _int(inner, 1, "num_values")


def _chunk_range(chunk: pq.ColumnChunkMetaData, rows: int,
                 file_size: int) -> tuple[int, int] | None:
    """The bytes pyarrow reads for a column chunk, as it computes them; None for the chunk of
    an empty row group that has no data page (pyarrow writes its ``data_page_offset`` as 0 and
    reads nothing of it)."""
    start = chunk.data_page_offset
    if chunk.has_dictionary_page and 0 < chunk.dictionary_page_offset < start:
        start = chunk.dictionary_page_offset
    if start == 0 and rows == 0:
        return None
    end = start + chunk.total_compressed_size
    if start < 4 or chunk.total_compressed_size < 0 or end > file_size:
        raise PagesError("a column chunk lies outside the file")
    return start, end


def decode_cost(path: Path, metadata: pq.FileMetaData) -> DecodeCost:
    """Walk every page header of ``path`` (whose footer is ``metadata``) and sum what
    decoding it takes.

    Raises:
        PagesError: Corrupt, or (:class:`PagesLimit`) beyond a limit of this module.
        OSError: The file cannot be read.
    """
    if metadata.num_row_groups > MAX_ROW_GROUPS:
        raise PagesLimit(f"{metadata.num_row_groups} row groups, over the {MAX_ROW_GROUPS} "
                         "a table may have")
    rows = page_bytes = pages = 0
    file_size = path.stat().st_size
    with path.open("rb") as f:
        for g in range(metadata.num_row_groups):
            group = metadata.row_group(g)
            if group.num_rows < 0:
                raise PagesError(f"row group {g} declares {group.num_rows} rows")
            rows += group.num_rows
            for c in range(group.num_columns):
                span = _chunk_range(group.column(c), group.num_rows, file_size)
                if span is None:
                    continue
                pos, end = span
                values = dictionaries = 0
                while pos < end:
                    header, length = _header(f, pos, end)
                    page_type = _int(header, 1, "type")
                    decoded = _int(header, 2, "uncompressed size")
                    pos += length + _int(header, 3, "compressed size")
                    pages += 1
                    if pages > MAX_PAGES:
                        raise PagesLimit(f"over {MAX_PAGES} pages")
                    page_bytes += decoded
                    if page_type == _DICTIONARY_PAGE:
                        dictionaries += 1
                        if dictionaries > 1:
                            raise PagesError(f"row group {g} column {c}: two dictionary pages")
                        if decoded > MAX_DICTIONARY_PAGE_BYTES:
                            raise PagesLimit(
                                f"row group {g} column {c}: a dictionary page of {decoded} "
                                f"bytes, over the {MAX_DICTIONARY_PAGE_BYTES} one may have")
                        _values(header, page_type)
                    else:
                        values += _values(header, page_type)
                if values != group.num_rows:
                    raise PagesError(f"row group {g} declares {group.num_rows} rows, but the "
                                     f"pages of its column {c} hold {values} values")
    if rows != metadata.num_rows:
        raise PagesError(f"the footer declares {metadata.num_rows} rows, its row groups "
                         f"{rows}")
    return DecodeCost(rows=rows, page_bytes=page_bytes, row_groups=metadata.num_row_groups)
