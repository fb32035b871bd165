"""The token arrays' shard files, encoded here byte for byte as zarr 3.1 writes them.

Why not ``arr[lo:hi] = values``: most of a commit's time in zarr is not Blosc but its
per-chunk machinery (asyncio and Python for every inner chunk, holding the GIL against the
extraction's forward thread; a fill buffer and a copy per chunk, a copy for each
crc32c, the shard's concatenation), and a commit that ends inside a shard file makes the next
one read that file back and rewrite it whole. Here each inner chunk is one Blosc call on a
view of the caller's values, or on one numpy copy of them into byte planes (Blosc and the
copy release the GIL, so chunks compress on a thread pool), and
the encoded chunks of the shard file a commit ends inside stay in memory, so the next commit
encodes only its own chunks (and the partial last one again) before writing the file.

What zarr writes (zarr/codecs/sharding.py, ``_encode_partial_single``; the array's own
pipeline has no bytes-to-bytes codec outside the sharding codec, so every write of a shard
takes that path): the shard file's existing chunks are kept as they are on disk; every inner
chunk the write overlaps is encoded (``write_empty_chunks`` is true, so zero chunks too), a
partly covered one merged first into its decoded old values, or into the fill value where it
had none; inner chunks never written (past the array's end in its last shard) are left out
and get the index pair (2^64-1, 2^64-1). A chunk is its C-order little-endian bytes, in one
of two inner pipelines (eyrie/store/codecs.py):

- ``bytes -> numcodecs.shuffle -> blosc -> crc32c`` (the bf16 arrays of new stores): the
  bytes byte-shuffled as numcodecs' ``Shuffle(elementsize)`` does, done here with numpy
  (``byte_planes``: the (elementsize, n) planes of the bytes, contiguous), then Blosc;
- ``bytes -> blosc -> crc32c`` (the other arrays, and every token array of older stores).

Blosc is numcodecs' with the codec's cname/clevel/shuffle/typesize/blocksize; then comes the
crc32c of the compressed bytes (``google_crc32c``, 4 bytes little endian). The file is the
present chunks in Morton order (the plain order here: only the token axis has more than one
chunk per shard), then the index of (offset, nbytes) uint64 little-endian pairs in that order
and its crc32c. This module checks an array's metadata for exactly those layouts and refuses
any other (``UnsupportedLayout``), so a store it cannot reproduce is written by zarr instead.

The kept state of a file always equals the file on disk: it changes only once the new file
has been renamed into place. A file this writer has not written (a resumed store's) is read
from disk once, as zarr would, so resumed stores hold zarr's bytes too.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import google_crc32c
import numpy as np
import zarr
from numcodecs import Blosc
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, ShardingCodec
from zarr.codecs.numcodecs import Shuffle

from eyrie.store.codecs import byte_planes, from_byte_planes
from eyrie.store.format import write_bytes_durable
from eyrie.store.parallel import cores

EMPTY = 2**64 - 1  # the index pair of an inner chunk the file does not hold
SHUFFLE = {"noshuffle": Blosc.NOSHUFFLE, "shuffle": Blosc.SHUFFLE, "bitshuffle": Blosc.BITSHUFFLE}
POOLED_CHUNK_BYTES = 64 << 10  # smaller chunks compress faster inline than a thread hand-off

Gather = Callable[[int, int], np.ndarray]  # values of tokens [lo, hi), a view where it can be


class UnsupportedLayout(ValueError):
    """An array whose shard files this module cannot reproduce exactly (zarr writes them)."""


@dataclass
class _ShardFile:
    """What one shard file on disk holds: its encoded chunks, and its partial last chunk."""

    chunks: list[tuple[bytes, ...] | None]  # per inner chunk: its bytes (with crc), or None
    tail: int | None = None  # inner chunk whose decoded values `tail_values` holds
    tail_values: np.ndarray | None = None


def _little(codec: BytesCodec) -> bool:
    return codec.endian is None or codec.endian.value == "little"  # None: 1-byte items


def _crc(data) -> bytes:
    return int(google_crc32c.value(data)).to_bytes(4, "little")


def numcodecs_blosc(codec: BloscCodec) -> Blosc:
    """numcodecs' Blosc with zarr's BloscCodec settings: the same frames, one call a chunk."""
    return Blosc(
        cname=codec.cname.value,
        clevel=codec.clevel,
        shuffle=SHUFFLE[codec.shuffle.value],
        blocksize=codec.blocksize,
        typesize=codec.typesize,
    )


def _shuffle_size(codec, dtype: np.dtype) -> int:
    """The element size of a numcodecs.shuffle codec as zarr runs it; 0 for anything else.

    zarr gives a shuffle without an element size the dtype's item size; an element size of 1
    (or less) leaves the bytes as they are, and so does ``byte_planes`` with 1.
    """
    if not isinstance(codec, Shuffle) or set(codec.codec_config) - {"id", "elementsize"}:
        return 0
    size = codec.codec_config.get("elementsize")
    size = dtype.itemsize if size is None else size
    if not isinstance(size, int) or isinstance(size, bool) or dtype.itemsize % max(size, 1):
        return 0  # zarr refuses chunks that are not whole elements; so does this module
    return max(size, 1)


class ShardFileEncoder:
    """Writes one token array's shard files; keeps the one the last write ended inside."""

    def __init__(self, arr: zarr.Array, folder: Path, pool: ThreadPoolExecutor | None = None):
        meta = arr.metadata
        codecs = getattr(meta, "codecs", ())
        sharding = codecs[0] if len(codecs) == 1 else None
        if not isinstance(sharding, ShardingCodec):
            raise UnsupportedLayout(f"{arr.path}: not a sharded array of one sharding codec")
        inner = list(sharding.codecs)
        self.dtype = np.dtype(meta.dtype.to_native_dtype())
        self.planes = _shuffle_size(inner.pop(1), self.dtype) if len(inner) == 4 else None
        ok = (
            len(inner) == 3
            and isinstance(inner[0], BytesCodec)
            and isinstance(inner[1], BloscCodec)
            and isinstance(inner[2], Crc32cCodec)
            and self.planes != 0
            and [type(c) for c in sharding.index_codecs] == [BytesCodec, Crc32cCodec]
            and sharding.index_location.value == "end"
            and sys.byteorder == "little"
            and _little(inner[0])
            and _little(sharding.index_codecs[0])
        )
        self.shard_shape = tuple(meta.chunk_grid.chunk_shape)
        self.chunk_shape = tuple(sharding.chunk_shape)
        if not ok or self.shard_shape[1:] != self.chunk_shape[1:]:
            raise UnsupportedLayout(f"{arr.path}: codecs or chunk grid other than the store's")
        if self.dtype.byteorder not in "=|<":
            raise UnsupportedLayout(f"{arr.path}: big-endian dtype {self.dtype}")
        self.fill_value = np.asarray(meta.fill_value, dtype=self.dtype)
        self.chunk_tokens, self.shard_tokens = self.chunk_shape[0], self.shard_shape[0]
        self.chunks_per_shard = self.shard_tokens // self.chunk_tokens
        self.blosc = numcodecs_blosc(inner[1])
        self.key = meta.chunk_key_encoding.encode_chunk_key
        self.tail_dims = (0,) * (len(self.shard_shape) - 1)
        self.folder = Path(folder)
        self.pool = pool
        self._open: dict[int, _ShardFile] = {}  # shard number -> its file as on disk

    def file_of(self, shard: int) -> str:
        """The shard file's path relative to the array's folder (e.g. ``c/3/0/0``)."""
        return self.key((shard, *self.tail_dims))

    def write(self, lo: int, hi: int, gather: Gather) -> str:
        """Write tokens [lo, hi) (one shard file's share) durably; returns the file's path.

        The file is written to a temporary name beside it, fsynced and renamed; its folder
        is left for the caller to fsync (the commit does, for all files at once).
        """
        shard, c = lo // self.shard_tokens, self.chunk_tokens
        base = shard * self.shard_tokens
        if hi <= lo or (hi - 1) // self.shard_tokens != shard:
            raise ValueError(f"tokens [{lo}, {hi}) are not within one shard file")
        rel = self.file_of(shard)
        old = self._open.get(shard) or self._read(self.folder / rel)
        chunks = list(old.chunks)
        tail = tail_values = None
        jobs = []
        for i in range((lo - base) // c, (hi - 1 - base) // c + 1):
            c0 = base + i * c
            a, b = max(lo, c0), min(hi, c0 + c)
            if a == c0 and b == c0 + c:
                values = np.ascontiguousarray(gather(a, b))
            else:  # partly covered: merged into its old values, as zarr does
                values = self._old_values(old, i)
                values[a - c0 : b - c0] = gather(a, b)
                if b == hi:
                    tail, tail_values = i, values
            jobs.append((i, values))
        for i, encoded in self._encode_all(jobs):
            chunks[i] = encoded
        write_bytes_durable(self.folder / rel, self._file_bytes(chunks))
        if hi == base + self.shard_tokens:  # the file is full: no later write comes back to it
            self._open.pop(shard, None)
        else:
            self._open[shard] = _ShardFile(chunks, tail, tail_values)
        return rel

    # -- internals ------------------------------------------------------------------------------

    def _encode(self, values: np.ndarray) -> tuple[bytes, bytes]:
        if self.planes is not None:
            values = byte_planes(values, self.planes)
        compressed = self.blosc.encode(values)
        return compressed, _crc(compressed)

    def _encode_all(self, jobs: list[tuple[int, np.ndarray]]):
        pooled = self.pool is not None and len(jobs) > 1
        if not pooled or jobs[0][1].nbytes < POOLED_CHUNK_BYTES:
            return [(i, self._encode(v)) for i, v in jobs]
        futures = [(i, self.pool.submit(self._encode, v)) for i, v in jobs]
        return [(i, f.result()) for i, f in futures]

    def _old_values(self, old: _ShardFile, i: int) -> np.ndarray:
        """A writable copy of inner chunk i's values: kept, decoded from disk, or the fill."""
        if old.tail == i and old.tail_values is not None:
            return old.tail_values.copy()
        if old.chunks[i] is None:
            return np.full(self.chunk_shape, self.fill_value, dtype=self.dtype)
        data = b"".join(old.chunks[i])
        if _crc(data[:-4]) != data[-4:]:
            raise ValueError("Stored and computed checksum do not match (inner chunk)")
        raw = self.blosc.decode(data[:-4])
        if self.planes is not None:
            return from_byte_planes(raw, self.dtype, self.chunk_shape, self.planes)
        return np.frombuffer(raw, dtype=self.dtype).reshape(self.chunk_shape).copy()

    def _file_bytes(self, chunks: list[tuple[bytes, ...] | None]) -> list:
        """The file's pieces: the present chunks in order, then the index and its crc32c."""
        index = np.full((self.chunks_per_shard, 2), EMPTY, dtype="<u8")
        pieces, at = [], 0
        for i, encoded in enumerate(chunks):
            if encoded is None:
                continue
            size = sum(len(p) for p in encoded)
            index[i] = (at, size)
            pieces += encoded
            at += size
        index_bytes = index.tobytes()
        return [*pieces, index_bytes, _crc(index_bytes)]

    def _read(self, path: Path) -> _ShardFile:
        """A shard file this writer has not written (a resumed store's), or an absent one."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return _ShardFile([None] * self.chunks_per_shard)
        size = 16 * self.chunks_per_shard
        index_bytes = data[-size - 4 : -4]
        if len(data) < size + 4 or _crc(index_bytes) != data[-4:]:
            raise ValueError(f"{path}: Stored and computed checksum do not match (shard index)")
        pairs = np.frombuffer(index_bytes, dtype="<u8").reshape(-1, 2)
        chunks = [None if int(o) == EMPTY else (data[int(o) : int(o) + int(n)],) for o, n in pairs]
        return _ShardFile(chunks)


class TokenShardFiles:
    """The encoders of a store's token arrays, and the threads their chunks compress on."""

    def __init__(self, store: Path, arrays: dict[str, zarr.Array], threads: int | None = None):
        n = cores() if threads is None else threads  # the writer's writer_threads
        self.pool = ThreadPoolExecutor(n, thread_name_prefix="eyrie-blosc") if n > 1 else None
        try:
            self.encoders = {
                name: ShardFileEncoder(arr, Path(store) / name, self.pool)
                for name, arr in arrays.items()
            }
        except BaseException:
            self.close()
            raise

    def write(self, name: str, lo: int, hi: int, gather: Gather) -> str:
        """Tokens [lo, hi) of one shard file of array `name`; returns ``name/<file>``."""
        return f"{name}/{self.encoders[name].write(lo, hi, gather)}"

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)
            self.pool = None
