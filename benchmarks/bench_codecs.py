"""Lossless (and bit-rounded) codecs for bf16 hidden states, on real activations of the toys.

The hidden states come from the project's own capture (eyrie.extract.hf.HFCapture) run
in-process on shipped chat samples: toy-llama (models/toy-llama) and toy-deepseek (built by
eyrie/target/toy/deepseek.py, the tiny variant by default). They are cut into the store's chunks
(aux (c, k, H) and final (c, H) uint16, c = 256 tokens) and each candidate compresses every
chunk on its own, as the store does. Printed per target: bytes/token and the ratio to raw
bf16, compress and decompress MB/s (of raw bytes, one thread), whether zarr can express the
candidate with its own codecs (so any Zarr v3 reader decodes it; "ext": with numcodecs'
zarr codecs, as zarr-python does), and order-0 entropy bounds. The baseline is the store's
current default (``StoreDefault``: eyrie.store.codecs.stored_as_planes, byte planes as the
store's shard-file encoder makes them for chunks under 512 KiB, Blosc's byte shuffle from it),
measured in the same run, and so are the old default (Blosc's byte shuffle, typesize 2, 1 MiB
blocks at every size) that stores written before it hold, and the planes at every size.

"yes*": c-blosc's split mode (each byte plane of a shuffled block compressed as its own zstd
stream) is set process-wide through ctypes (numcodecs does not expose it); its frames are
standard Blosc, but the run also checks small buffers, which forced splitting makes
undecodable in numcodecs 0.16.6's c-blosc 1.21.7.dev: why the store does not use it.

    python benchmarks/bench_codecs.py                     # ~2 min on 2 loaded cores
    python benchmarks/bench_codecs.py --samples 64 --deepseek-full
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import tempfile
import time
from pathlib import Path

import numcodecs
import numpy as np
import torch
from common import ROOT, host_line, versions_line
from numcodecs import Blosc, Zstd

from eyrie.store.codecs import (
    byte_planes,
    from_byte_planes,
    plane_compressors,
    round_bf16_bits,
    stored_as_planes,
)
from eyrie.store.shard_files import numcodecs_blosc

MIB = 1 << 20


def use_split_streams(on: bool) -> None:
    """c-blosc's split mode, process-wide (numcodecs does not expose it): ALWAYS compresses each
    byte plane of a shuffled block as its own stream; FORWARD_COMPAT (the default) does not
    for zstd."""
    lib = ctypes.CDLL(numcodecs.blosc.__file__)
    lib.blosc_set_splitmode(ctypes.c_int(1 if on else 4))


def split_mode_is_safe() -> list[str]:
    """Small buffers that forced split mode compresses into frames Blosc cannot decode."""
    bad = []
    use_split_streams(True)
    try:
        for dtype in (np.uint8, np.uint16, np.int32):
            for n in (1, 7, 32, 71, 256, 4096, 65536):
                x = (np.arange(n) * 7 % 4000).astype(dtype)
                codec = Blosc(cname="zstd", clevel=1, shuffle=Blosc.SHUFFLE, blocksize=MIB)
                try:
                    ok = np.array_equal(np.frombuffer(codec.decode(codec.encode(x)), dtype), x)
                except RuntimeError:
                    ok = False
                if not ok:
                    bad.append(f"{np.dtype(dtype).name}[{n}]")
    finally:
        use_split_streams(False)
    return bad


# ---------------------------------------------------------------------------------------------
# real activations


def capture_states(target_path: Path, data: Path, samples: int, max_tokens: int, batch: int):
    """aux (T, k, H) and final (T, H) uint16 bf16 bits of the first `samples` good samples."""
    from eyrie.data.chat_tokens import SampleError, tokenize_chat
    from eyrie.extract.hf import HFCapture
    from eyrie.store.shard import bf16_bits
    from eyrie.target.layers import resolve_aux_layer_ids
    from eyrie.target.load import load_target, num_hidden_layers

    target = load_target(target_path, device="cpu")
    aux_ids = resolve_aux_layer_ids(None, num_hidden_layers(target_path))
    seqs = []
    with open(data, encoding="utf-8") as f:
        for line in f:
            if len(seqs) >= samples:
                break
            try:
                seqs.append(
                    tokenize_chat(target.tokenizer, json.loads(line)["messages"], max_tokens)
                )
            except SampleError:
                continue
    aux, final = [], []
    pad = target.tokenizer.pad_token_id
    with HFCapture(target.model, aux_ids, pad_token_id=pad) as cap:
        for i in range(0, len(seqs), batch):
            for a, b in cap.capture([s.input_ids for s in seqs[i : i + batch]]):
                aux.append(bf16_bits(a))
                final.append(bf16_bits(b))
    return np.concatenate(aux), np.concatenate(final), aux_ids


def chunks(aux: np.ndarray, final: np.ndarray, c: int) -> list[np.ndarray]:
    """The store's inner chunks (whole ones only), aux then final."""
    n = aux.shape[0] // c
    return [aux[i * c : (i + 1) * c] for i in range(n)] + [
        final[i * c : (i + 1) * c] for i in range(n)
    ]


# ---------------------------------------------------------------------------------------------
# candidates: encode(chunk) -> list of buffers, decode(buffers, like) -> chunk


class BloscC:
    """Blosc as zarr's BloscCodec runs it; typesize by viewing the bytes as wider items."""

    def __init__(
        self, cname="zstd", clevel=1, shuffle=Blosc.SHUFFLE, typesize=2, blocksize=MIB, split=False
    ):
        self.codec = Blosc(cname=cname, clevel=clevel, shuffle=shuffle, blocksize=blocksize)
        self.view = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[typesize]
        self.split = split

    def encode(self, x):
        use_split_streams(self.split)
        try:
            return [self.codec.encode(np.ascontiguousarray(x).reshape(-1).view(self.view))]
        finally:
            use_split_streams(False)

    def decode(self, bufs, like):
        return np.frombuffer(self.codec.decode(bufs[0]), dtype=np.uint16).reshape(like.shape)


class PlanesBlosc:
    """The byte-plane layout, as the store's shard-file encoder writes a chunk: the two byte
    planes (numcodecs.shuffle), then Blosc as ``plane_compressors(chunk bytes)`` sets it
    (zstd-1, no shuffle, typesize 1, a block a plane: two zstd streams)."""

    def __init__(self):
        self.codecs: dict[int, Blosc] = {}

    def blosc(self, nbytes: int) -> Blosc:
        if nbytes not in self.codecs:
            self.codecs[nbytes] = numcodecs_blosc(plane_compressors(nbytes)[1])
        return self.codecs[nbytes]

    def encode(self, x):
        return [self.blosc(x.nbytes).encode(byte_planes(x))]

    def decode(self, bufs, like):
        raw = self.blosc(like.nbytes).decode(bufs[0])
        return from_byte_planes(raw, np.uint16, like.shape)


class StoreDefault:
    """The store's default for each chunk, as ``hidden_compressors`` picks it by the chunk's
    size: the byte planes under ``PLANES_BELOW`` (512 KiB), Blosc's own byte shuffle from it."""

    def __init__(self):
        self.planes, self.shuffled = PlanesBlosc(), BloscC()

    def pick(self, nbytes: int):
        return self.planes if stored_as_planes(nbytes) else self.shuffled

    def encode(self, x):
        return self.pick(x.nbytes).encode(x)

    def decode(self, bufs, like):
        return self.pick(like.nbytes).decode(bufs, like)


class Transposed:
    """Channel-major order (zarr's TransposeCodec): each channel's c tokens side by side."""

    def __init__(self, inner):
        self.inner = inner

    def encode(self, x):
        return self.inner.encode(np.ascontiguousarray(np.moveaxis(x, 0, -1)))

    def decode(self, bufs, like):
        shape = (*like.shape[1:], like.shape[0])
        flat = self.inner.decode(bufs, np.empty(shape, np.uint16))
        return np.ascontiguousarray(np.moveaxis(flat, -1, 0))


class Planes:
    """Two uint8 planes compressed apart (not a zarr codec: needs a custom one to read).

    split="byte": high byte (sign + 7 exponent bits) and low byte (exponent LSB + mantissa);
    split="exp": the 8 exponent bits, and sign + 7 mantissa bits (a 1-bit rotation first).
    """

    def __init__(self, split="byte", hi=None, lo=None):
        self.split = split
        self.hi = hi or Zstd(level=1)
        self.lo = lo  # None: stored raw (it is close to incompressible)

    def encode(self, x):
        v = np.ascontiguousarray(x).reshape(-1)
        if self.split == "exp":
            v = ((v << 1) | (v >> 15)).astype(np.uint16)
        hi, lo = (v >> 8).astype(np.uint8), (v & 0xFF).astype(np.uint8)
        return [self.hi.encode(hi), self.lo.encode(lo) if self.lo else lo.tobytes()]

    def decode(self, bufs, like):
        hi = np.frombuffer(self.hi.decode(bufs[0]), np.uint8).astype(np.uint16)
        lo = np.frombuffer(self.lo.decode(bufs[1]) if self.lo else bufs[1], np.uint8)
        v = (hi << 8) | lo
        if self.split == "exp":
            v = ((v >> 1) | (v << 15)).astype(np.uint16)
        return v.reshape(like.shape)


class Rounded:
    """Bit rounding to `keep` mantissa bits (eyrie.store.codecs, numcodecs' BitRound) first."""

    def __init__(self, keep, inner):
        self.keep, self.inner = keep, inner

    def encode(self, x):
        return self.inner.encode(round_bf16_bits(x, self.keep))

    def decode(self, bufs, like):
        return self.inner.decode(bufs, like)


def candidates(args) -> list[tuple[str, str, object]]:
    B, N = Blosc.BITSHUFFLE, Blosc.NOSHUFFLE
    c = [
        ("default: byte planes under 512 KiB chunks, else the old default", "ext", StoreDefault()),
        ("old default: blosc zstd-1 shuffle ts2 1MiB", "yes", BloscC()),
        (
            "byte planes at every size: blosc zstd-1 noshuffle ts1, block = chunk/2",
            "ext",
            PlanesBlosc(),
        ),
        ("old default, split streams (c-blosc ALWAYS_SPLIT)", "yes*", BloscC(split=True)),
        ("blosc zstd-3 shuffle ts2 1MiB, split", "yes*", BloscC(clevel=3, split=True)),
        ("blosc zstd-1 shuffle ts2 256KiB, split", "yes*", BloscC(blocksize=256 << 10, split=True)),
        ("blosc zstd-1 bitshuffle ts2 1MiB, split", "yes*", BloscC(shuffle=B, split=True)),
        ("blosc lz4-5 shuffle ts2 1MiB, split", "yes*", BloscC(cname="lz4", clevel=5, split=True)),
        ("blosc zstd-1 shuffle ts2 default block", "yes", BloscC(blocksize=0)),
        ("blosc zstd-1 noshuffle", "yes", BloscC(shuffle=N)),
        ("blosc zstd-1 shuffle ts4 1MiB", "yes", BloscC(typesize=4)),
        ("blosc zstd-1 bitshuffle ts2 1MiB", "yes", BloscC(shuffle=B)),
        ("blosc zstd-3 shuffle ts2 1MiB", "yes", BloscC(clevel=3)),
        ("blosc zstd-5 shuffle ts2 1MiB", "yes", BloscC(clevel=5)),
        ("blosc zstd-9 shuffle ts2 1MiB", "yes", BloscC(clevel=9)),
        ("blosc zstd-3 bitshuffle ts2 1MiB", "yes", BloscC(clevel=3, shuffle=B)),
        ("blosc lz4-5 shuffle ts2 1MiB", "yes", BloscC(cname="lz4", clevel=5)),
        ("blosc lz4hc-5 shuffle ts2 1MiB", "yes", BloscC(cname="lz4hc", clevel=5)),
        ("blosc zstd-1 shuffle ts2 256KiB", "yes", BloscC(blocksize=256 << 10)),
        ("blosc zstd-1 shuffle ts2 4MiB", "yes", BloscC(blocksize=4 * MIB)),
        ("transpose + blosc zstd-1 shuffle 1MiB", "yes", Transposed(BloscC())),
        ("transpose + blosc zstd-3 shuffle 1MiB", "yes", Transposed(BloscC(clevel=3))),
        ("transpose + blosc zstd-1 bitshuffle", "yes", Transposed(BloscC(shuffle=B))),
        ("planes (byte): hi zstd-1, lo raw", "no", Planes("byte")),
        ("planes (byte): hi zstd-1, lo zstd-1", "no", Planes("byte", lo=Zstd(level=1))),
        ("planes (exp|sign+mant): exp zstd-1, lo raw", "no", Planes("exp")),
        ("planes (exp|sign+mant): exp zstd-3, lo raw", "no", Planes("exp", hi=Zstd(level=3))),
        ("transpose + planes (exp): zstd-1, lo raw", "no", Transposed(Planes("exp"))),
    ]
    c += [(f"bitround-{n} + default", "ext", Rounded(n, StoreDefault())) for n in args.lossy]
    return c


def measure(codec, parts: list[np.ndarray], repeats: int) -> tuple[int, float, float]:
    """(stored bytes, compress s, decompress s), best of repeats; decoding checked bit-exact."""
    best_c = best_d = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        enc = [codec.encode(p) for p in parts]
        t1 = time.perf_counter()
        dec = [codec.decode(e, p) for e, p in zip(enc, parts, strict=True)]
        t2 = time.perf_counter()
        best_c, best_d = min(best_c, t1 - t0), min(best_d, t2 - t1)
    keep = codec.keep if isinstance(codec, Rounded) else None
    want = parts if keep is None else [round_bf16_bits(p, keep) for p in parts]
    for d, p in zip(dec, want, strict=True):
        if not np.array_equal(d, p):
            raise AssertionError("a candidate did not decode to its input")
    return sum(len(b) for e in enc for b in e), best_c, best_d


# ---------------------------------------------------------------------------------------------
# entropy bounds (order 0: the best any coder of independent symbols can do)


def entropy_bits(symbols: np.ndarray, n: int) -> float:
    counts = np.bincount(symbols.reshape(-1), minlength=n).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log2(p)).sum())


def bounds(aux: np.ndarray, final: np.ndarray) -> dict[str, float]:
    """Bits per value: whole 16-bit symbols; exponent alone and per channel; mantissa."""
    cols = np.concatenate([aux.reshape(aux.shape[0], -1), final], axis=1)  # (T, (k+1) H)
    exp = ((cols >> 7) & 0xFF).astype(np.int64)
    mant = (cols & 0x7F).astype(np.int64)
    per_channel = np.mean([entropy_bits(exp[:, j], 256) for j in range(cols.shape[1])])
    return {
        "H16": entropy_bits(cols.astype(np.int64), 1 << 16),
        "H(exp)": entropy_bits(exp, 256),
        "H(exp|channel)": float(per_channel),
        "H(mant)": entropy_bits(mant, 128),
    }


# ---------------------------------------------------------------------------------------------


def run_target(name, path, args) -> None:
    t0 = time.perf_counter()
    cache = args.cache / f"{name}-{args.samples}-{args.max_tokens}.npz" if args.cache else None
    if cache and cache.is_file():
        z = np.load(cache)
        aux, final, aux_ids = z["aux"], z["final"], z["aux_ids"].tolist()
    else:
        aux, final, aux_ids = capture_states(
            path, args.data, args.samples, args.max_tokens, args.batch_size
        )
        if cache:
            cache.parent.mkdir(parents=True, exist_ok=True)
            np.savez(cache, aux=aux, final=final, aux_ids=np.array(aux_ids))
    cap_s = time.perf_counter() - t0
    T, k, H = aux.shape
    parts = chunks(aux, final, args.chunk_tokens)
    n_tok = (len(parts) // 2) * args.chunk_tokens
    raw = sum(p.nbytes for p in parts)
    raw_pt = raw / n_tok
    b = bounds(aux[:n_tok], final[:n_tok])
    print(
        f"\n## {name}: {path.name}, H={H}, k={k} (aux ids {aux_ids}), {T} tokens captured in "
        f"{cap_s:.1f} s, {n_tok} in whole {args.chunk_tokens}-token chunks, {raw / 1e6:.1f} MB raw"
    )
    print(
        f"order-0 entropy, bits/value: 16-bit symbol {b['H16']:.2f} "
        f"(bound {b['H16'] / 16:.3f}x raw)"
        f"; exponent {b['H(exp)']:.2f}, per channel {b['H(exp|channel)']:.2f}; mantissa "
        f"{b['H(mant)']:.2f} of 7 (sign+exp|channel+mant bound "
        f"{(1 + b['H(exp|channel)'] + b['H(mant)']) / 16:.3f}x)"
    )
    use_split_streams(False)
    rows, base = [], None
    for label, std, codec in candidates(args):
        size, cs, ds = measure(codec, parts, args.repeats)
        base = base or size
        rows.append(
            (label, std, size / n_tok, size / raw, size / base, raw / cs / 1e6, raw / ds / 1e6)
        )
    print(
        f"| codec | zarr codecs | bytes/token | vs raw bf16 ({raw_pt:.0f} B) | vs default "
        "| compress MB/s | decompress MB/s |"
    )
    print("|---|---|---|---|---|---|---|")
    for label, std, bpt, vr, vb, cm, dm in rows:
        print(f"| {label} | {std} | {bpt:,.0f} | {vr:.3f} | {vb:.3f} | {cm:,.0f} | {dm:,.0f} |")
    new, old = rows[0], rows[1]
    print(
        f"default vs old default: {new[3]:.3f} / {old[3]:.3f} of raw = {new[3] / old[3]:.3f}; "
        f"decompress {new[6]:,.0f} / {old[6]:,.0f} MB/s, compress {new[5]:,.0f} / {old[5]:,.0f}"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT / "data" / "chat" / "train.jsonl")
    ap.add_argument("--samples", type=int, default=160, help="chat samples per target")
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--chunk-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--lossy", type=int, nargs="*", default=[4, 3, 2], help="bitround N rows")
    ap.add_argument("--deepseek-full", action="store_true", help="the served size, not tiny")
    ap.add_argument("--targets", nargs="+", default=["toy-llama", "toy-deepseek"])
    ap.add_argument("--cache", type=Path, help="keep captured states here for reruns")
    args = ap.parse_args(argv)
    numcodecs.blosc.set_nthreads(1)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

    print(host_line())
    blosc = f"{numcodecs.__version__} (blosc {numcodecs.blosc.VERSION_STRING}), 1 blosc thread"
    print(versions_line(numcodecs=blosc))
    print(f"data: first {args.samples} samples of {args.data}, max_tokens {args.max_tokens}")
    bad = split_mode_is_safe()
    print(
        "c-blosc forced split mode round trip of small buffers: "
        + (f"FAILS for {', '.join(bad)} (undecodable frames)" if bad else "ok")
    )
    with tempfile.TemporaryDirectory(prefix="bench_codecs-") as tmp:
        for name in args.targets:
            if name == "toy-llama":
                path = ROOT / "models" / "toy-llama"
            else:
                from eyrie.target.toy.deepseek import build

                path = build(
                    Path(tmp) / "toy-deepseek",
                    ROOT / "models" / "toy-llama",
                    0,
                    tiny=not args.deepseek_full,
                )
            run_target(name, path, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
