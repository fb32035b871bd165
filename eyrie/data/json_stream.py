"""One JSON array read element by element, in flat memory: ShareGPT's 125 MB file without
`json.load`.

ShareGPT ships as a single JSON array (`[{"id": ..., "conversations": [...]}, ...]`), and the
copy most users have is cut off inside a string. `ArrayReader` reads such a file in chunks
(`CHUNK` bytes), decodes them incrementally and parses one element at a time with the standard
library's `json.JSONDecoder.raw_decode`, so memory holds one chunk and the element being parsed,
never the file, and a caller that stops early (dataset.max_samples) reads little more than what
it took. Each element comes with its number in the array (1-based), the line it starts on and
the byte offset of its first byte.

What goes wrong is an `Item` with a problem kind, never an exception: `truncated_file` once
when the file ends before the array's closing `]` (inside an element, which is then lost, or
between two), `malformed_json` when an element is not JSON (the array cannot be followed past
it: reading stops there) or when data follows the closing `]`, `not_utf8` for an element with
bytes that are not UTF-8 (the elements around it are read). Why `raw_decode` and not the
`ijson` package: the measurements are in docs/datasets.md (it parses each element in C, as
json.loads does, with no dependency and the same values as json.load).
"""

from __future__ import annotations

import codecs
import json
import re
from dataclasses import dataclass
from pathlib import Path

CHUNK = 1 << 20  # bytes per read
LOOKAHEAD = 16  # an error this close to the text's end may be the text's end, not bad JSON
_SPACE = " \t\n\r"
_NOT_UTF8 = re.compile("[\udc80-\udcff]")  # bytes that are not UTF-8, as surrogateescape reads them
_PARTIAL_TOKEN = re.compile(r"[^,:\[\]{}\"]{0,%d}" % LOOKAHEAD)  # e.g. `tru`, `-`, `\u00`
_LEADING_ID = re.compile(r'\{\s*"(?:id|question_id)"\s*:\s*("(?:[^"\\\n]|\\.){1,200}"|\d{1,20})')


@dataclass(frozen=True)
class Item:
    """One element of the array, or the problem found where one was expected."""

    number: int  # 1-based position in the array
    line: int  # 1-based line of the file the element starts on
    offset: int  # byte offset (0-based) of its first byte in the file
    value: object = None  # the parsed element (when kind is None)
    kind: str | None = None  # truncated_file, malformed_json or not_utf8
    reason: str = ""


def starts_array(path: str | Path) -> bool:
    """Whether the file's first character (past a byte order mark and whitespace) is `[`."""
    with open(path, "rb") as fh:
        head = fh.read(4096)
        while head and not head.lstrip().removeprefix(b"\xef\xbb\xbf").lstrip():
            more = fh.read(4096)  # a file that opens with much whitespace
            if not more:
                break
            head = head.lstrip() + more
    return head.removeprefix(b"\xef\xbb\xbf").lstrip().startswith(b"[")


class ArrayReader:
    """Iterate over `Item`s of the JSON array in binary file `fh` (positioned at its start).

    `bytes_read` counts the bytes taken from `fh`; `offset_of` and `line_of` place a character
    of the text in hand in the file."""

    def __init__(self, fh, chunk: int | None = None):
        self.fh, self.chunk = fh, int(chunk or CHUNK)
        self._decode = codecs.getincrementaldecoder("utf-8")("surrogateescape").decode
        self.buf = ""  # text read and not yet dropped; buf[mark] is at byte _mark_byte
        self.eof = False
        self.bytes_read = 0
        self._mark, self._mark_byte, self._mark_line = 0, 0, 1
        self._decoder = json.JSONDecoder()

    # ------------------------------------------------------------------ positions

    def _advance(self, to: int) -> None:
        """Move the mark (a character whose byte offset and line are known) to `to`."""
        if to == self._mark:
            return
        sign = 1 if to > self._mark else -1
        text = self.buf[min(to, self._mark) : max(to, self._mark)]
        self._mark_byte += sign * len(text.encode("utf-8", "surrogateescape"))
        self._mark_line += sign * text.count("\n")
        self._mark = to

    def offset_of(self, at: int) -> int:
        self._advance(at)
        return self._mark_byte

    def line_of(self, at: int) -> int:
        self._advance(at)
        return self._mark_line

    # ------------------------------------------------------------------ reading

    def _more(self, keep: int) -> bool:
        """Read on: at least a chunk, or as much again as the text from `keep` on (so an element
        larger than a chunk is parsed a logarithmic number of times). Text before `keep` is
        dropped. False at the end of the file."""
        self._advance(keep)
        self.buf, self._mark = self.buf[keep:], 0
        data = self.fh.read(max(self.chunk, len(self.buf)))
        self.bytes_read += len(data)
        if not data:
            self.eof = True
            self.buf += self._decode(b"", final=True)
            return False
        self.buf += self._decode(data)
        return True

    def _skip_space(self, pos: int, keep: int) -> int:
        """The index of the next non-whitespace character from `pos` (reading on as needed);
        len(buf) at the end of the file. `keep`: the first index still needed."""
        while True:
            while pos < len(self.buf) and self.buf[pos] in _SPACE:
                pos += 1
            if pos < len(self.buf) or self.eof:
                return pos
            pos -= keep
            self._more(keep)
            keep = 0

    def __iter__(self):
        pos = self._skip_space(0, 0)
        if self.buf.startswith("\ufeff", pos):  # a UTF-8 byte order mark
            pos = self._skip_space(pos + 1, pos + 1)
        if not self.buf.startswith("[", pos):
            yield self._bad(1, pos, "malformed_json", "the file does not start with [")
            return
        pos = self._skip_space(pos + 1, pos)
        number = 0
        if pos >= len(self.buf):
            yield self._bad(1, pos, "truncated_file", self._cut_between(0))
            return
        if self.buf.startswith("]", pos):
            yield from self._after_close(pos + 1, number)
            return
        while True:
            number += 1
            item, pos = self._element(number, pos)
            yield item
            if item.kind in ("truncated_file", "malformed_json"):
                return
            pos = self._skip_space(pos, pos)
            if pos >= len(self.buf):
                yield self._bad(number + 1, pos, "truncated_file", self._cut_between(number))
                return
            if self.buf[pos] == "]":
                yield from self._after_close(pos + 1, number)
                return
            if self.buf[pos] != ",":
                what = f"{self.buf[pos : pos + 20]!r}"
                yield self._bad(
                    number + 1, pos, "malformed_json",
                    f"expected , or ] after element {number}, found {what}: "
                    + self._stops(number),
                )  # fmt: skip
                return
            pos = self._skip_space(pos + 1, pos + 1)
            if pos >= len(self.buf):
                yield self._bad(number + 1, pos, "truncated_file", self._cut_between(number))
                return

    def _element(self, number: int, start: int) -> tuple[Item, int]:
        """(the element at `start`, the index after it); reads on while it is incomplete."""
        while True:
            try:
                value, end = self._decoder.raw_decode(self.buf, start)
            except json.JSONDecodeError as exc:
                if self._incomplete(exc, start) and not self.eof:
                    self._more(start)
                    start = 0
                    continue
                if self._incomplete(exc, start):
                    reason = self._cut_inside(number, start)
                    return self._bad(number, start, "truncated_file", reason), 0
                at = self.offset_of(exc.pos) if exc.pos >= start else self.offset_of(start)
                line = self.line_of(max(exc.pos, start))
                return self._bad(
                    number, start, "malformed_json",
                    f"element {number} is not valid JSON: {exc.msg} at byte {at} (line {line}); "
                    + self._stops(number - 1),
                ), 0  # fmt: skip
            if end >= len(self.buf) and not self.eof and not isinstance(value, dict | list | str):
                self._more(start)  # a number may go on in the next chunk
                start = 0
                continue
            bad = _NOT_UTF8.search(self.buf, start, end)
            if bad is not None:
                at = self.offset_of(bad.start())
                byte = f"0x{ord(bad.group()) - 0xDC00:02x}"
                return self._bad(
                    number, start, "not_utf8",
                    f"byte {byte} at byte offset {at} is not UTF-8; re-encode the file as UTF-8",
                ), end  # fmt: skip
            return Item(number, self.line_of(start), self.offset_of(start), value), end

    def _incomplete(self, exc: json.JSONDecodeError, start: int) -> bool:
        """Whether the text may only have ended too soon (more of the file would go on)."""
        if exc.msg.startswith("Unterminated string"):
            return True
        rest = self.buf[max(exc.pos, start) :].rstrip(_SPACE)
        if self.eof:  # what is left is a token's beginning (`tru`, `-`, `\u00`) or nothing
            return _PARTIAL_TOKEN.fullmatch(rest) is not None
        return len(rest) <= LOOKAHEAD

    def _after_close(self, pos: int, number: int):
        """After the closing `]` (`number` elements read): only whitespace may follow."""
        pos = self._skip_space(pos, pos)
        if pos < len(self.buf):
            yield Item(
                number + 1, self.line_of(pos), self.offset_of(pos), kind="malformed_json",
                reason=f"data after the array's closing ] ({self.buf[pos : pos + 20]!r}): "
                "a file holds one array; the data after it is not read",
            )  # fmt: skip

    def _bad(self, number: int, at: int, kind: str, reason: str) -> Item:
        at = min(at, len(self.buf))
        return Item(number, self.line_of(at), self.offset_of(at), kind=kind, reason=reason)

    def _cut_inside(self, number: int, start: int) -> str:
        end = self._mark_byte + len(self.buf[self._mark :].encode("utf-8", "surrogateescape"))
        sid = _LEADING_ID.match(self.buf, start)
        named = f" (id {sid.group(1)})" if sid else ""
        return (
            f"the file ends inside element {number}{named}, at byte {end}: the array is cut off "
            f"there (a partial download or copy); the {number - 1} elements before it are read, "
            "this one is lost"
        )

    @staticmethod
    def _cut_between(number: int) -> str:
        after = f"after element {number}" if number else "after the array's ["
        return (
            f"the file ends {after}, before the array's closing ]: it may be cut off there (a "
            f"partial download or copy); the {number} elements before are read"
        )

    @staticmethod
    def _stops(done: int) -> str:
        return (
            f"the array cannot be followed past it, so reading stops here ({done} elements "
            "before it read); fix the file"
        )
