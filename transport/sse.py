"""Server-sent events and HTTP/1.1 chunked transfer, decoded incrementally (pure: no I/O).

`SSEDecoder.feed(bytes)` returns the `data` payload of every event the bytes completed. Lines end
in CRLF, LF or CR, as the SSE specification allows (so events are separated by `\\n\\n`,
`\\r\\n\\r\\n` or `\\r\\r`); a CR at the very end of a read is held back until the next byte says
whether it is half of a CRLF. Comments (`:` lines) and the `event`, `id` and `retry` fields are
ignored; several `data` lines of one event are joined with `\\n`, as the specification says.

`Dechunker.feed(bytes)` turns raw HTTP/1.1 chunked bytes into payload bytes; a size line that is
not a hexadecimal size raises `ValueError` (the client records it as the request's error).
`SSEDecoder.feed` never raises.
"""

from __future__ import annotations

import re

_NEWLINE = re.compile(rb"\r\n|\r|\n")
_CR = 13


class SSEDecoder:
    """Incremental SSE decoder: `feed(raw) -> [data payload of each completed event]`."""

    def __init__(self) -> None:
        self._pending = b""
        self._data: list[bytes] = []
        self._skip_lf = False  # the previous read ended in CR: a leading LF completes a CRLF

    def feed(self, chunk: bytes) -> list[bytes]:
        if self._skip_lf and chunk:
            self._skip_lf = False
            if chunk.startswith(b"\n"):
                chunk = chunk[1:]
        buffer = self._pending + chunk if self._pending else chunk
        events: list[bytes] = []
        position, size = 0, len(buffer)
        while True:
            found = _NEWLINE.search(buffer, position)
            if found is None:
                break
            start, end = found.span()
            if end == size and buffer[start] == _CR and end - start == 1:
                self._skip_lf = True
            line = buffer[position:start]
            position = end
            if not line:
                if self._data:
                    events.append(b"\n".join(self._data))
                    self._data = []
                continue
            if line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
            elif line == b"data":
                self._data.append(b"")
        self._pending = buffer[position:]
        return events


class Dechunker:
    """Incremental HTTP/1.1 chunked-transfer decoder: `feed(raw) -> payload bytes`."""

    def __init__(self) -> None:
        self.raw = b""
        self.left = 0  # payload bytes still due in the current chunk
        self.finished = False

    def feed(self, data: bytes) -> bytes:
        self.raw += data
        out = []
        while self.raw and not self.finished:
            if self.left > 0:
                take = self.raw[:self.left]
                out.append(take)
                self.left -= len(take)
                self.raw = self.raw[len(take):]
                if self.left:
                    break
                self.left = -2  # the CRLF after a chunk's payload
            if self.left < 0:
                if len(self.raw) < 2:
                    break
                self.raw, self.left = self.raw[2:], 0
                continue
            line_end = self.raw.find(b"\r\n")
            if line_end < 0:
                break
            size_line = self.raw[:line_end]
            try:
                size = int(size_line.split(b";", 1)[0], 16)
            except ValueError:
                size = -1
            if size < 0:
                raise ValueError(f"malformed chunk size line {size_line[:40]!r} in a chunked "
                                 "response")
            self.raw = self.raw[line_end + 2:]
            if size == 0:
                self.finished = True  # trailers, if any, are ignored
                break
            self.left = size
        return b"".join(out)
