"""Read a trace file as a stream of event chunks, never holding the whole text in memory.

A Kineto trace is one JSON object whose `traceEvents` array holds nearly all of the bytes. The
reader decodes the keys before the array as a header, then cuts the array into chunks of a few
MB at event boundaries and decodes each chunk on its own with msgspec. A boundary is found with
a cheap pattern (`}` `,` `{`), which can also match inside a string or a nested object; such a
false cut always leaves the left part unbalanced, so msgspec rejects it and the reader widens
the chunk to the next candidate. Decoding therefore never silently accepts a wrong split.

The Chrome trace-event format's other forms are handled too: a bare array of events, with or
without its closing bracket, and objects whose `traceEvents` key does not come first.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import queue
import re
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, cast

import msgspec

from wallfinder.errors import WallfinderError
from wallfinder.trace._columns import Chunk, decode_chunk
from wallfinder.trace._schema import Header

_fast_gzip: Any
GZIP_DATA_ERRORS: tuple[type[Exception], ...] = (gzip.BadGzipFile, zlib.error)
"""What reading damaged gzip data raises (a truncated stream raises EOFError)."""
try:  # python-isal decompresses gzip several times faster than zlib.
    from isal import igzip as _fast_gzip
    from isal import isal_zlib

    # isal's IsalError (corrupt deflate data) derives from Exception alone.
    GZIP_DATA_ERRORS = (*GZIP_DATA_ERRORS, cast("type[Exception]", isal_zlib.error))
except ImportError:  # pragma: no cover - depends on the environment
    _fast_gzip = None
_GZIP_ERRORS: tuple[type[Exception], ...] = (OSError, ValueError, *GZIP_DATA_ERRORS)
DAMAGED_GZIP: tuple[type[Exception], ...] = (EOFError, *GZIP_DATA_ERRORS)
"""What reading a truncated or damaged gzip file raises."""
UNREADABLE: tuple[type[Exception], ...] = (OSError, *DAMAGED_GZIP)
"""What opening and reading a file (plain or gzip) can raise."""


@contextlib.contextmanager
def read_errors(path: Path, folder: str) -> Iterator[None]:
    """Inside: opening and reading `path`. What that raises leaves as a one-line
    `WallfinderError` naming the file: missing, a folder (`folder` says what was expected
    instead), damaged gzip data, or another error of the system's."""
    try:
        yield
    except FileNotFoundError:
        raise WallfinderError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise WallfinderError(f"{path}: is a folder, {folder}") from None
    except DAMAGED_GZIP:  # before OSError: a bad gzip file is one
        raise WallfinderError(f"{path}: truncated or damaged gzip file") from None
    except OSError as exc:
        raise WallfinderError(f"{path}: cannot be read ({exc.strerror or exc})") from None


BLOCK = 8 << 20
"""Bytes of (decompressed) text read per step, at most; also the target size of a decoded
chunk. A file of less than 32 blocks of text reads a thirty-second of it per step, down to a
sixteenth of a block: the text in flight (a block being read ahead, the window, a chunk, and
the pieces in flight between the parsing process and its helpers) is most of the parse's
peak memory on the traces of tens of MB people bring most (a 14 MB trace: 78 -> 57 MB, and 2
MB less again with blocks of 512 KiB, not 1 MiB; an 87 MB one decoded in worker processes:
its largest process 108 -> 92 MB, its process tree about 150 -> 115 MB), at no cost in
time."""

HEADER_LIMIT = 256 << 20
"""How far into the file the `traceEvents` key is looked for before decoding it whole."""

REGION = 2 << 20
"""Bytes of a plain file decoded at once by the parsing process or a helper: small enough
that they share the work evenly to its end (measured on 2 cores against 8 MiB: a 54 MB
plain trace 0.39 -> 0.30 s, a 203 MB one 1.05 -> 0.89 s and its largest process 131 ->
117 MB)."""

TAIL = 2 << 20
"""Towards the end of the file, pieces shrink to about half this, and at most this much is
left for the parent process to decode at the end."""

_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_ARRAY_END = re.compile(rb"\}\s*\]")
_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_decode_header = msgspec.json.Decoder(Header).decode
_decode_any = msgspec.json.Decoder().decode

Progress = Callable[[int, int], None]


class Cut(msgspec.Struct):
    """A run of whole events, framed as a JSON array (`[` + text + `]`), and the separator
    that followed it in the file (kept so that a false cut can be undone exactly)."""

    framed: bytes
    separator: bytes

    def join(self, following: bytes) -> bytes:
        """This cut's text, its separator and `following` text: the file's original bytes."""
        return self.framed[1:-1] + self.separator + following

    def merge(self, following: Cut) -> Cut:
        """This cut and the next one as one piece (to undo a false cut between them)."""
        return Cut(b"[" + self.join(following.framed[1:-1]) + b"]", following.separator)

    def decode(self) -> Chunk:
        return decode_chunk(self.framed)


class Region(msgspec.Struct):
    """Bytes [start, end) of a plain trace file: whole events, from the `{` of the first to
    just before the `{` of the event after the last. The process that decodes the region
    reads it itself, so the text never passes between processes."""

    path: str
    start: int
    end: int

    def join(self, following: bytes) -> bytes:
        """This region's bytes followed by `following`: the file's original bytes."""
        with open(self.path, "rb") as f:
            f.seek(self.start)
            return f.read(self.end - self.start) + following

    def merge(self, following: Region) -> Region:
        return Region(self.path, self.start, following.end)

    def decode(self) -> Chunk:
        size = self.end - self.start
        # Read into the middle of a buffer with room for the brackets: no copy of the text.
        buf = bytearray(size + 2)
        with open(self.path, "rb") as f:
            f.seek(self.start)
            got = f.readinto(memoryview(buf)[1 : size + 1])
        last = buf.rfind(b"}", 0, got + 1)
        if got != size or last < 0:
            return Chunk(problem=("json", "the file changed or ends early"))
        buf[0] = 0x5B
        buf[last + 1] = 0x5D
        return decode_chunk(memoryview(buf)[: last + 2])


class Remainder(msgspec.Struct):
    """The text left after the last cut: the last events, the array's end and what follows.
    `bare` is true for the bare-array form, whose closing bracket may be missing."""

    text: bytes
    bare: bool


class Document(msgspec.Struct):
    """What the reader found besides the events."""

    header: Header
    bare: bool = False
    """The bare-array form: there are no keys after the events."""
    whole: bytes | None = None
    """The events, framed as one JSON array, of a document that could not be streamed."""


def _open(path: Path) -> tuple[BinaryIO, BinaryIO]:
    """Open `path` for streaming; returns (text stream, raw file)."""
    with read_errors(path, "expected a trace file"):
        raw = path.open("rb")
    return gunzipped(raw), raw


GZIP_MAGIC = b"\x1f\x8b"


def gunzipped(f: BinaryIO) -> BinaryIO:
    """`f` itself, or a stream of its decompressed bytes when it holds gzip (by its first two
    bytes, whatever its name says), read from its start: the one place that tells them apart
    for traces, snapshots and saved results."""
    head = f.read(2)
    f.seek(0)
    if head != GZIP_MAGIC:
        return f
    module: Any = _fast_gzip if _fast_gzip is not None else gzip
    stream: BinaryIO = module.GzipFile(fileobj=f, mode="rb")
    return stream


def text_size(path: Path) -> int:
    """The size of the trace's JSON text: the file size, or for gzip the size its trailer
    records (modulo 4 GiB, so files over that are estimated from the compressed size)."""
    size = path.stat().st_size
    with path.open("rb") as f:
        if f.read(2) != GZIP_MAGIC or size < 18:
            return size
        f.seek(-4, 2)
        recorded = int.from_bytes(f.read(4), "little")
    return max(recorded, size * 4) if size * 4 > 1 << 32 else recorded


class _ReadAhead:
    """Reads blocks of a stream in a background thread, one block ahead. Errors
    are raised from `read` in the caller's thread, where `_read` turns them into one line."""

    def __init__(self, stream: BinaryIO, block: int) -> None:
        self._stream = stream
        self._block = block
        self._blocks: queue.Queue[bytes | BaseException] = queue.Queue(maxsize=1)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wallfinder-read", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                block: bytes | BaseException = self._stream.read(self._block)
            except BaseException as exc:
                block = exc
            self._blocks.put(block)  # waits while the reader is a block behind
            if not isinstance(block, bytes) or not block:
                return

    def read(self, size: int) -> bytes:
        del size  # blocks come in pieces of the size given at the start
        item = self._blocks.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def stop(self) -> None:
        """End the thread, also when the reader stopped early (an error, a consumer that
        gave up): a block waiting in the queue is dropped so that the thread's put returns."""
        self._stopped.set()
        while self._thread.is_alive():
            with contextlib.suppress(queue.Empty):
                self._blocks.get_nowait()
            self._thread.join(timeout=0.01)


def _read(stream: BinaryIO | _ReadAhead, path: Path, size: int) -> bytes:
    try:
        return stream.read(size)
    except EOFError:
        raise WallfinderError(
            f"{path.name}: the gzip stream ends early (truncated or incomplete download)"
        ) from None
    except _GZIP_ERRORS as exc:
        raise WallfinderError(f"{path.name}: not a readable gzip file ({exc})") from None


Piece = Cut | Region | Remainder


class ChunkReader:
    """Walks the text once and yields the event array as chunks of text cut at (candidate)
    event boundaries, then a `Remainder`. `buf` is a sliding window over the stream: consumed
    text is dropped from its front (O(1) for a bytearray) and new blocks go onto its end.

    After iteration, `document` holds the header (and, for documents that could not be
    streamed, all events).
    """

    def __init__(
        self, path: Path, progress: Progress | None = None, *, regions: bool = False
    ) -> None:
        self.path = path
        self.progress = progress
        self.regions = regions
        self.block = min(BLOCK, max(BLOCK // 16, text_size(path) // 32))
        self.eof = False
        self.buf = bytearray()
        self.document = Document(Header())
        self._header_text = b""

    def chunks(self) -> Iterator[Piece]:
        stream, raw = _open(self.path)
        total = max(self.path.stat().st_size, 1)
        with raw, stream:
            source: BinaryIO | _ReadAhead = stream
            if stream is not raw and not self.regions:
                # Inflate the next block in a thread while this one is decoded: gzip
                # decompression releases the GIL. (Not beside helper processes, which may be
                # forked: a fork must not happen while another thread runs.)
                source = _ReadAhead(stream, self.block)
            try:
                yield from self._walk(source, raw, lambda: self._tick(raw, total))
            finally:
                if isinstance(source, _ReadAhead):
                    source.stop()

    def _tick(self, raw: BinaryIO, total: int) -> None:
        if self.progress is not None:
            self.progress(raw.tell(), total)

    def _more(self, stream: BinaryIO | _ReadAhead, tick: Callable[[], None]) -> None:
        block = _read(stream, self.path, self.block)
        if not block:
            self.eof = True
        self.buf += block
        tick()

    def _walk(
        self, stream: BinaryIO | _ReadAhead, raw: BinaryIO, tick: Callable[[], None]
    ) -> Iterator[Piece]:
        def more() -> None:
            self._more(stream, tick)

        more()
        while not self.eof and len(self.buf) < 4096:
            more()
        buf = self.buf
        start = _skip_ws(buf, 0)
        if start >= len(buf):
            raise WallfinderError(f"{self.path.name}: the file is empty")
        first = buf[start : start + 1]
        if first == b"[":
            self.document = Document(Header(), bare=True)
            yield from self._array(start + 1, more, bare=True)
            return
        if first != b"{":
            raise WallfinderError(
                f"{self.path.name}: not JSON (starts with {bytes(buf[start : start + 12])!r})"
            )
        match = _KEY.search(buf)
        while match is None and not self.eof and len(buf) < HEADER_LIMIT:
            more()  # a header (deviceProperties, distributedInfo) larger than a block
            match = _KEY.search(buf)
        header = None
        if match is not None:
            header = _try_header(bytes(buf[start : match.start()]))
        if match is None or header is None:
            # `traceEvents` is not near the start at top level: decode the whole document.
            while not self.eof:
                more()
            self.document = self._whole(bytes(self.buf))
            return
        self.document = Document(header)
        if self.regions and stream is raw:
            # `buf` holds the file from offset 0, so positions in it are file offsets.
            yield from self._regions(raw, match.end(), tick)
            return
        yield from self._array(match.end(), more, bare=False)

    def _tail(self, bare: bool) -> Iterator[Cut | Remainder]:
        """The rest of the read text: cut into small pieces while much is left (they decode
        beside each other in the parsing process and its helpers), then the last bit as a
        `Remainder`."""
        buf = self.buf
        pos = 0
        while len(buf) - pos > TAIL:
            match = _BOUNDARY.search(buf, pos + TAIL // 2)
            if match is None:
                break
            with memoryview(buf) as view:
                framed = b"".join((b"[", view[pos : match.start() + 1], b"]"))
                separator = bytes(view[match.start() + 1 : match.end() - 1])
            yield Cut(framed, separator)
            pos = match.end() - 1
        yield Remainder(bytes(buf[pos:]), bare)

    def _regions(
        self, raw: BinaryIO, start: int, tick: Callable[[], None]
    ) -> Iterator[Region | Remainder]:
        """Split a plain file's event array into regions of about REGION bytes, reading only
        a small window at each cut, then yield the rest of the file as a `Remainder`."""
        size = os.fstat(raw.fileno()).st_size
        pos = _skip_ws(self.buf, start) if start < len(self.buf) else start
        while size - pos > TAIL:
            # Full regions, then smaller ones towards the end, so that little is left for
            # this process to decode alone while the helpers wait.
            step = REGION if size - pos > REGION + REGION // 4 else TAIL // 2
            cut = _next_boundary(raw, pos + step)
            if cut is None:
                break
            yield Region(str(self.path), pos, cut)
            pos = cut
            raw.seek(pos)
            tick()
        raw.seek(pos)
        yield Remainder(raw.read(), False)
        tick()

    def _whole(self, text: bytes) -> Document:
        try:
            doc = _decode_any(text)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            raise json_error(self.path.name, str(exc)) from None
        if not isinstance(doc, dict) or "traceEvents" not in doc:
            # Keys come from the file: quoted (repr) and cut, so the message stays one line.
            keys = (
                ", ".join(repr(k)[:40] for k in list(doc)[:5])
                if isinstance(doc, dict)
                else type(doc).__name__
            )
            raise WallfinderError(
                f"{self.path.name}: JSON but not a profiler trace (no 'traceEvents'; has {keys})"
            )
        events = doc.pop("traceEvents")
        if not isinstance(events, list):
            raise WallfinderError(f"{self.path.name}: 'traceEvents' is not a list")
        try:
            header = msgspec.convert(doc, Header, strict=False)
        except msgspec.ValidationError as exc:
            raise WallfinderError(f"{self.path.name}: malformed header ({exc})") from None
        # Re-encoded so that the events go through the same typed decoder as streamed ones.
        return Document(header, whole=msgspec.json.encode(events))

    def _array(self, pos: int, more: Callable[[], None], *, bare: bool) -> Iterator[Piece]:
        """Yield the array's text from `pos` in cuts of at least half a block, each ending
        just before the `{` of the next event, then the rest of the file."""
        buf = self.buf
        while True:
            if pos:
                del buf[:pos]
                pos = 0
            while not self.eof and len(buf) < self.block:
                more()
            if self.eof:
                yield from self._tail(bare)
                return
            match = _BOUNDARY.search(buf, self.block // 2)
            if match is None:
                more()
                continue
            # One copy: the framed chunk is built straight from the window.
            with memoryview(buf) as view:
                framed = b"".join((b"[", view[: match.start() + 1], b"]"))
                separator = bytes(view[match.start() + 1 : match.end() - 1])
            yield Cut(framed, separator)
            pos = match.end() - 1


def _next_boundary(raw: BinaryIO, target: int) -> int | None:
    """File offset of the `{` of the first event boundary at or after `target`, or None."""
    window = 1 << 20
    while True:
        raw.seek(target)
        data = raw.read(window)
        match = _BOUNDARY.search(data)
        if match is not None:
            return target + match.end() - 1
        if len(data) < window:
            return None
        # Overlap the windows so that a boundary across two of them is still found.
        target += window - 4096


def _skip_ws(buf: bytes | bytearray, pos: int) -> int:
    while pos < len(buf) and buf[pos] in b" \t\r\n":
        pos += 1
    if buf.startswith(b"\xef\xbb\xbf", pos):  # a UTF-8 byte-order mark
        return _skip_ws(buf, pos + 3)
    return pos


def _try_header(text: bytes) -> Header | None:
    body = text.rstrip().rstrip(b",")
    try:
        return _decode_header(body + b"}")
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
        return None


def json_error(source: str, text: str) -> WallfinderError:
    if "truncated" in text.lower():
        return WallfinderError(f"{source}: the JSON ends early (truncated file?)")
    return WallfinderError(f"{source}: not valid JSON ({text})")


def split_remainder(
    remainder: Remainder, decode: Callable[[bytes], Any], source: str
) -> tuple[Any, bytes]:
    """Find where the event array ends in the last piece of text: the first `}` `]` at which
    the events before it decode. Returns (decoded chunk or None, text after the array)."""
    text = remainder.text
    pos = _skip_ws(text, 0)
    if text.startswith(b"]", pos):
        return None, text[pos + 1 :]
    if pos >= len(text):
        if remainder.bare:
            return None, b""
        raise WallfinderError(f"{source}: the JSON ends early (truncated file?)")
    last_error = ""
    for match in _ARRAY_END.finditer(text, pos):
        chunk = decode(b"[" + text[pos : match.start() + 1] + b"]")
        if chunk.problem is None or chunk.problem[0] != "json":
            return chunk, text[match.end() :]
        last_error = str(chunk.problem[1])
    if remainder.bare:
        # The Chrome format allows a bare array without its closing bracket.
        body = text[pos:].rstrip()
        chunk = decode(b"[" + (body[:-1] if body.endswith(b",") else body) + b"]")
        if chunk.problem is None or chunk.problem[0] != "json":
            return chunk, b""
        last_error = str(chunk.problem[1])
    raise json_error(source, last_error or "truncated")


def merge_tail(header: Header, tail: bytes, source: str) -> Header:
    """Keys after the array (Kineto writes `displayTimeUnit`, `baseTimeNanoseconds` there)."""
    text = tail.strip()
    if text == b"}":
        return header
    if not text:
        raise WallfinderError(f"{source}: the JSON ends early (truncated file?)")
    if not text.startswith(b","):
        raise WallfinderError(f"{source}: malformed JSON after the event array")
    try:
        rest = _decode_header(b"{" + text[1:])
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError):
        raise WallfinderError(f"{source}: the JSON ends early (truncated file?)") from None
    merged = {
        name: getattr(rest, name) if getattr(rest, name) is not None else getattr(header, name)
        for name in Header.__struct_fields__
    }
    return Header(**merged)


def iter_trace_files(folder: Path) -> Iterator[Path]:
    """Trace files in a folder (one per rank), in name order."""
    for child in sorted(folder.iterdir()):
        if child.is_file() and child.name.endswith((".json", ".json.gz", ".pt.trace.json")):
            yield child
