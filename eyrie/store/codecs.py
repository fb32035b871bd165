"""Codecs and precision of the shard store's hidden states (docs/store-format.md).

Two things live here, apart from the writer and reader (eyrie/store/writer.py, reader.py):

- The arrays' codec pipelines (``create_arrays``). The bf16 arrays (``aux_hidden``,
  ``final_hidden``) pick theirs by the inner chunk's size (``hidden_compressors``):
  - under 512 KiB (the toys' 32-384 KiB chunks), two byte planes: ``bytes`` -> numcodecs'
    ``shuffle`` (element size 2) -> Blosc zstd-1 without shuffle, typesize 1, blocks of half
    the chunk -> crc32c (``plane_compressors``). The shuffle makes a chunk [every low
    byte][every high byte], and the half-chunk block makes each plane its own zstd stream;
  - from 512 KiB (a 256-token chunk of any model with hidden 1024 or more), Blosc zstd-1 with
    its own byte shuffle, typesize 2, 1 MiB blocks -> crc32c (``blosc_compressors(2)``).
  Why: a bf16 value's high byte (sign, 7 exponent bits) is very repetitive, its low byte (the
  exponent's last bit, 7 mantissa bits) close to random. In a small chunk one zstd stream
  codes both planes of Blosc's shuffled block, so its entropy coding (a Huffman table per
  128 KiB zstd block) fits a mix of the two; separate streams are smaller, decoding as fast.
  In large chunks each plane of a Blosc block fills whole zstd blocks anyway: the two layouts
  are about as small, and the planes decode slower (unshuffled in a pass of their own, not in
  Blosc's cache). ``benchmarks/bench_codecs.py`` measures both (the figures:
  docs/store-format.md, benchmarks/RESULTS.md). ``input_ids`` and ``loss_mask`` (5 bytes a token)
  keep ``blosc_compressors``: core Zarr v3 codecs only, so any Zarr v3 reader gets the
  tokens. Every codec is recorded in each array's ``zarr.json``, so a reader never needs to
  know which Eyrie wrote a store; all are core Zarr v3 codecs (or registered extensions)
  except ``numcodecs.shuffle``, which zarr-python (>= 3.1.3, with numcodecs) reads and other
  Zarr implementations may not (zarr warns so at every open; Eyrie's own opens silence that
  one warning, ``eyrie.store.format.quiet_numcodecs``). Stores written before (every bf16
  array on ``blosc_compressors(2)``) stay readable and resumable: readers and writers take
  the pipeline from each array's metadata.
- The optional lossy precision (``extract.precision: bitround-N``): each bf16 value is rounded
  to N of its 7 mantissa bits (round to nearest, ties to even) before compression, with
  numcodecs' ``BitRound`` on the exact float32 value. The stored arrays stay plain uint16 bf16
  bit patterns (the low 7 - N mantissa bits are zero), so the codec pipeline and every reader are
  unchanged; the group attribute ``precision`` says what was dropped, and validation relaxes its
  cosine bar by the rounding's known bound. Stores without the attribute are lossless.
"""

from __future__ import annotations

import math
import re

import numpy as np
import zarr
from numcodecs import BitRound
from zarr.codecs import BloscCodec, BytesCodec, Crc32cCodec, ZstdCodec
from zarr.codecs.numcodecs import Shuffle

from eyrie.common.errors import EyrieError
from eyrie.store.format import quiet_numcodecs

SAMPLE_CHUNK = 4096  # chunk length of the per-sample arrays (offsets, sample_id)
BLOSC_BLOCKSIZE = 1 << 20  # input_ids, loss_mask (and the bf16 arrays of stores written before)
PLANE_BYTES = 2  # bf16: the shuffle's element size, so two byte planes per chunk
PLANES_BELOW = 512 << 10  # bf16 chunks under this many bytes are stored as two byte planes
WRITE_CONFIG = {"write_empty_chunks": True}  # every chunk exists, so a missing file is damage
BF16_MANTISSA_BITS = 7
LOSSLESS = "lossless"
_BITROUND = re.compile(r"^bitround-([0-9]+)$")


class PrecisionError(EyrieError, ValueError):
    """An unknown precision name; the message says which ones exist."""


# ---------------------------------------------------------------------------------------------
# precision


def mantissa_bits(precision: str | None) -> int | None:
    """Kept mantissa bits of a precision name: None for lossless, N for "bitround-N"."""
    if precision in (None, LOSSLESS):
        return None
    m = _BITROUND.match(str(precision))
    if not m or not 0 <= int(m.group(1)) < BF16_MANTISSA_BITS:
        raise PrecisionError(
            f"extract.precision {precision!r}: use 'lossless' or 'bitround-N' with N in "
            f"0..{BF16_MANTISSA_BITS - 1} (mantissa bits kept of bfloat16's 7)"
        )
    return int(m.group(1))


def max_relative_error(keep: int | None) -> float:
    """Bound on |rounded - x| / |x| for every finite value of magnitude >= the smallest normal."""
    return 0.0 if keep is None else 2.0 ** -(keep + 1)


def precision_attrs(precision: str | None) -> dict:
    """The group attribute ``precision`` of a new store."""
    keep = mantissa_bits(precision)
    if keep is None:
        return {"kind": LOSSLESS, "mantissa_bits": BF16_MANTISSA_BITS}
    return {
        "kind": "bitround",
        "name": f"bitround-{keep}",
        "mantissa_bits": keep,
        "rounding": "nearest, ties to even (numcodecs BitRound on the exact float32 value)",
        "max_relative_error": max_relative_error(keep),
    }


def stored_mantissa_bits(attrs: dict) -> int | None:
    """None for a lossless store (also one written before the attribute existed), else N."""
    p = attrs.get("precision")
    if not isinstance(p, dict) or p.get("kind", LOSSLESS) == LOSSLESS:
        return None
    return int(p["mantissa_bits"])


def round_bf16_bits(bits: np.ndarray, keep: int | None) -> np.ndarray:
    """bf16 bit patterns rounded to `keep` mantissa bits (a new uint16 array; None: a copy).

    bf16 -> float32 is exact (the pattern shifted left 16), so BitRound(keepbits=keep) on
    float32 rounds exactly as rounding the bf16 value would; the result's low 16 bits are zero
    and it shifts back without loss. Values that round past the largest finite bf16 become Inf
    (extraction refuses non-finite states before they get here).
    """
    bits = np.asarray(bits)
    if bits.dtype != np.uint16:
        raise TypeError(f"round_bf16_bits takes uint16 bf16 bit patterns, got {bits.dtype}")
    if keep is None:
        return bits.copy()
    f32 = (bits.astype(np.uint32) << 16).view(np.float32)
    rounded = np.asarray(BitRound(keepbits=int(keep)).encode(f32)).view(np.uint32)
    return (rounded.reshape(bits.shape) >> 16).astype(np.uint16)


def cosine_bar(min_cosine: float, keep: int | None) -> float:
    """The spot check's bar for a store rounded to `keep` bits.

    Rounding moves each value by at most eps = 2^-(keep+1) of itself, so the stored vector is
    within angle asin(eps) of the exact one; the two angles add.
    """
    if keep is None:
        return float(min_cosine)
    angle = math.acos(max(-1.0, min(1.0, float(min_cosine))))
    return math.cos(min(math.pi, angle + math.asin(max_relative_error(keep))))


# ---------------------------------------------------------------------------------------------
# the arrays of a new store


def hidden_compressors(chunk_bytes: int) -> list:
    """The bf16 arrays' compressors for inner chunks of `chunk_bytes` raw bytes.

    The two byte planes (``plane_compressors``) below ``PLANES_BELOW``, where they are smaller
    than Blosc's own byte shuffle at the same decode speed; Blosc's byte shuffle
    (``blosc_compressors(2)``) from it, where the two are about as small and the planes would
    decode slower (docs/store-format.md; benchmarks/RESULTS.md, "The new lossless default").
    """
    if stored_as_planes(chunk_bytes):
        return plane_compressors(chunk_bytes)
    return blosc_compressors(PLANE_BYTES)


def stored_as_planes(chunk_bytes: int) -> bool:
    """Whether a new store keeps bf16 chunks of `chunk_bytes` as two byte planes."""
    _check_bf16_chunk(chunk_bytes)
    return chunk_bytes < PLANES_BELOW


def _check_bf16_chunk(chunk_bytes: int) -> None:
    if chunk_bytes < PLANE_BYTES or chunk_bytes % PLANE_BYTES:
        raise ValueError(f"a bf16 chunk has an even, positive byte size, got {chunk_bytes}")


def plane_compressors(chunk_bytes: int) -> list:
    """numcodecs' shuffle of 2-byte items, Blosc zstd-1 without shuffle, crc32c.

    After the shuffle a chunk is its low-byte plane, then its high-byte plane; a Blosc block
    of half the chunk compresses each plane as its own zstd stream (Blosc raises blocks under
    128 bytes to 128, so a chunk of less than 256 bytes mixes them: it still round-trips).
    """
    _check_bf16_chunk(chunk_bytes)
    with quiet_numcodecs():
        shuffle = Shuffle(elementsize=PLANE_BYTES)
    return [
        shuffle,
        BloscCodec(
            cname="zstd",
            clevel=1,
            shuffle="noshuffle",
            typesize=1,
            blocksize=chunk_bytes // PLANE_BYTES,
        ),
        Crc32cCodec(),
    ]


def blosc_compressors(typesize: int) -> list:
    """Blosc zstd-1 with byte shuffle of `typesize`-byte items in 1 MiB blocks, then crc32c.

    ``input_ids`` (4) and ``loss_mask`` (1); also the bf16 arrays (2) of stores written before
    ``hidden_compressors``, which readers and resumed writers still take as they are.
    """
    return [
        BloscCodec(
            cname="zstd",
            clevel=1,
            shuffle="shuffle",
            typesize=typesize,
            blocksize=BLOSC_BLOCKSIZE,
        ),
        Crc32cCodec(),
    ]


def byte_planes(values: np.ndarray, elementsize: int = PLANE_BYTES) -> np.ndarray:
    """The bytes of `values` as (elementsize, n) uint8 planes, C-contiguous: plane j holds byte j
    (little endian: plane 0 the lowest) of every element, in order.

    Its bytes are what numcodecs' ``Shuffle(elementsize)`` makes of the values' bytes (the
    ``numcodecs.shuffle`` codec of the bf16 arrays), one strided numpy copy.
    """
    raw = np.ascontiguousarray(values).reshape(-1).view(np.uint8)
    if raw.size % elementsize:
        raise ValueError(f"{raw.size} bytes are not a whole number of {elementsize}-byte items")
    return np.ascontiguousarray(raw.reshape(-1, elementsize).T)


def from_byte_planes(planes, dtype, shape, elementsize: int = PLANE_BYTES) -> np.ndarray:
    """The inverse of ``byte_planes``: a new C-contiguous array of `dtype` and `shape`.

    One copy a plane into its byte of every item (a transposed copy is several times slower).
    """
    raw = np.frombuffer(planes, dtype=np.uint8)
    if raw.size % elementsize:
        raise ValueError(f"{raw.size} bytes are not a whole number of {elementsize}-byte items")
    src = raw.reshape(elementsize, -1)
    out = np.empty((src.shape[1], elementsize), dtype=np.uint8)
    for j in range(elementsize):
        out[:, j] = src[j]
    return out.reshape(-1).view(dtype).reshape(shape)


AUTO_SHARD_BYTES = 64 << 20  # raw aux_hidden bytes per shard file under shard_tokens: auto
MAX_AUTO_SHARD_TOKENS = 4096


def shard_tokens_for(setting, chunk_tokens: int, hidden: int, k: int) -> int:
    """Tokens per shard file: an integer as given, or ``auto``.

    A commit rewrites the whole shard file it ends in, so a shard much larger than a commit
    group is written several times over. ``auto`` keeps aux_hidden's shard file near 64 MiB
    raw: the largest chunk_tokens x 2^n at most 4096 tokens within that size (4096 at the toys'
    widths, 2048 at hidden 4096 with 3 aux layers, 1024 at 7168), and one chunk at least. The
    4096 cap: larger shard files made the toys' commit groups (about 7,500 tokens) write about
    twice the store's bytes, where the writer was the limit of extraction on the H200
    (benchmarks/RESULTS.md).
    """
    if setting != "auto":
        return int(setting)
    per_token = 2 * int(k) * int(hidden)
    tokens = int(chunk_tokens)
    while tokens * 2 <= MAX_AUTO_SHARD_TOKENS and tokens * 2 * per_token <= AUTO_SHARD_BYTES:
        tokens *= 2
    return tokens


def create_arrays(
    group: zarr.Group, k: int, hidden: int, chunk_tokens: int, shard_tokens: int
) -> None:
    """The six arrays, empty (length 0 on the token and sample axes)."""
    ser = BytesCodec()

    def token_array(name, dtype, tail, compressors, dims, attrs=None):
        group.create_array(
            name,
            shape=(0, *tail),
            dtype=dtype,
            chunks=(chunk_tokens, *tail),
            shards=(shard_tokens, *tail),
            serializer=ser,
            compressors=compressors,
            fill_value=0,
            dimension_names=dims,
            attributes=attrs or {},
            config=WRITE_CONFIG,
        )

    def bf16_compressors(*tail: int) -> list:
        return hidden_compressors(chunk_tokens * math.prod(tail) * np.dtype(np.uint16).itemsize)

    bf16 = {"dtype": "bfloat16", "encoding": "uint16 holds the bfloat16 bit pattern"}
    token_array("input_ids", "int32", (), blosc_compressors(4), ("token",))
    token_array("loss_mask", "uint8", (), blosc_compressors(1), ("token",))
    with quiet_numcodecs():
        token_array(
            "aux_hidden",
            "uint16",
            (k, hidden),
            bf16_compressors(k, hidden),
            ("token", "aux_layer", "hidden"),
            bf16,
        )
        token_array(
            "final_hidden",
            "uint16",
            (hidden,),
            bf16_compressors(hidden),
            ("token", "hidden"),
            bf16,
        )
    offsets = group.create_array(
        "offsets",
        shape=(1,),
        dtype="int64",
        chunks=(SAMPLE_CHUNK,),
        serializer=ser,
        compressors=[ZstdCodec(level=1), Crc32cCodec()],
        fill_value=0,
        dimension_names=("sample_edge",),
        config=WRITE_CONFIG,
    )
    offsets[0:1] = np.zeros(1, dtype=np.int64)  # offsets[0] = 0, stored as a real chunk
    group.create_array(
        "sample_id",
        shape=(0,),
        dtype=str,
        chunks=(SAMPLE_CHUNK,),
        compressors=[ZstdCodec(level=1), Crc32cCodec()],
        dimension_names=("sample",),
        config=WRITE_CONFIG,
    )
