"""Parse Thrift compact-protocol structs, the encoding of parquet's page headers and footer.

pyarrow decodes a page as its header declares, and offers no way to see the header first;
:mod:`kit.bundle.parquet_pages` reads the headers with this module to learn what decoding will
take before pyarrow does it. Only what a struct holds is returned, generically: field id ->
(wire type, value). Bounded for hostile bytes: nesting, container sizes and the bytes read are
checked, and anything malformed raises :class:`ThriftError`.
"""

import struct
from typing import Any

MAX_DEPTH = 16
"""Deepest nesting of structs and containers (a parquet page header has three levels)."""

BOOL_TRUE, BOOL_FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(1, 13)
"""The compact protocol's wire types."""


class ThriftError(ValueError):
    """Bytes that are not a well-formed compact-protocol struct (or one too deep)."""


class ThriftTruncated(ThriftError):
    """The bytes end before the struct does (more of them may complete it)."""


class CompactReader:
    """A cursor over ``data`` that reads one compact-protocol struct at a time."""

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data = data
        self.pos = pos

    def _byte(self) -> int:
        if self.pos >= len(self.data):
            raise ThriftTruncated("ends inside a struct")
        self.pos += 1
        return self.data[self.pos - 1]

    def _take(self, n: int) -> bytes:
        if n < 0:
            raise ThriftError("a negative length")
        if self.pos + n > len(self.data):
            raise ThriftTruncated("ends inside a value")
        self.pos += n
        return self.data[self.pos - n:self.pos]

    def _varint(self) -> int:
        value = shift = 0
        while True:
            b = self._byte()
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 63:
                raise ThriftError("a varint over 64 bits")

    def _zigzag(self) -> int:
        n = self._varint()
        return (n >> 1) ^ -(n & 1)

    def _value(self, kind: int, depth: int) -> Any:
        if kind in (BOOL_TRUE, BOOL_FALSE):  # inside a container: one byte, 1 true, 2 false
            return self._byte() == BOOL_TRUE
        if kind == BYTE:
            return self._byte()
        if kind in (I16, I32, I64):
            return self._zigzag()
        if kind == DOUBLE:
            return struct.unpack("<d", self._take(8))[0]
        if kind == BINARY:
            return self._take(self._varint())
        if kind in (LIST, SET):
            head = self._byte()
            size, elem = head >> 4, head & 0x0F
            if size == 15:
                size = self._varint()
            return elem, [self._value(elem, depth + 1) for _ in self._count(size)]
        if kind == MAP:
            size = self._varint()
            types = self._byte() if size else 0
            return [(self._value(types >> 4, depth + 1), self._value(types & 0x0F, depth + 1))
                    for _ in self._count(size)]
        if kind == STRUCT:
            return self.read_struct(depth + 1)
        raise ThriftError(f"unknown wire type {kind}")

    def _count(self, size: int) -> range:
        if size > len(self.data) - self.pos:  # every element takes at least one byte
            raise ThriftTruncated(f"a container of {size} elements in fewer bytes")
        return range(size)

    def read_struct(self, depth: int = 0) -> dict[int, tuple[int, Any]]:
        """Read one struct from the cursor: field id -> (wire type, value).

        A bool field's value is its type (``BOOL_TRUE``/``BOOL_FALSE``) as True/False; a list
        or set is ``(element type, [values])``; a map ``[(key, value)]``.

        Raises:
            ThriftError: Malformed, cut short, or nested deeper than :data:`MAX_DEPTH`.
        """
        if depth > MAX_DEPTH:
            raise ThriftError(f"nested deeper than {MAX_DEPTH} levels")
        fields: dict[int, tuple[int, Any]] = {}
        last = 0
        while (head := self._byte()) != 0:
            delta, kind = head >> 4, head & 0x0F
            last = last + delta if delta else self._zigzag()
            if kind in (BOOL_TRUE, BOOL_FALSE):
                fields[last] = (kind, kind == BOOL_TRUE)
            else:
                fields[last] = (kind, self._value(kind, depth))
        return fields
