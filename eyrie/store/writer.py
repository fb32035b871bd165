"""Appending samples to one shard store, crash-safe (the commit protocol of docs/store-format.md).

A writer may be killed at any instant. Data for new samples is written and fsynced first; only
then is ``commit.json`` atomically replaced. A rerun shrinks every array back to the committed
length, so a half-written sample is never visible and nothing is ever duplicated.
"""

from __future__ import annotations

import os
import shutil
import uuid
from functools import partial
from pathlib import Path

import numpy as np
import zarr

from eyrie.store.codecs import (
    SAMPLE_CHUNK,
    PrecisionError,
    mantissa_bits,
    precision_attrs,
    round_bf16_bits,
)
from eyrie.store.codecs import WRITE_CONFIG as _WRITE_CONFIG
from eyrie.store.codecs import create_arrays as _create_arrays
from eyrie.store.format import (
    ALL_ARRAYS,
    COMMIT_RECORD,
    OUR_TMP,
    STORE_VERSION,
    TOKEN_ARRAYS,
    ZARR_TMP,
    StoreError,
    check_version,
    committed_lengths,
    expected_chunk_files,
    folders_present,
    fsync,
    fsync_tree,
    ids_digest,
    input_bits,
    int_vector,
    json_normal,
    local_store,
    quiet_numcodecs,
    read_commit,
    root_attrs,
    write_json_durable,
)
from eyrie.store.lock import StoreLock
from eyrie.store.parallel import Pool, resolve_threads, spans
from eyrie.store.resume import check_same_setup
from eyrie.store.shard_files import TokenShardFiles, UnsupportedLayout

# Who encodes the token arrays' shard files: "eyrie" (eyrie/store/shard_files.py, the same
# bytes as zarr's at a fraction of its overhead) or "zarr" (``arr[lo:hi] = values``).
SHARD_ENCODERS = ("eyrie", "zarr")
SHARD_ENCODER = "eyrie"
GROW_AHEAD = 8  # commits of room an array is grown by when a commit overflows it


class ShardWriter:
    """Appends samples to one shard store; commit() makes them durable, finish() seals it.

    Opening an existing store resumes from its last commit: anything written after it is
    discarded. One writer per store at a time: the writer holds `eyrie.store.lock.StoreLock`
    (a file lock beside the store, taken before the store is looked at), or is given one its
    caller holds. ``num_samples``/``num_tokens`` count committed samples only.
    """

    def __init__(
        self,
        path,
        *,
        hidden_size: int,
        aux_layer_ids: list[int],
        provenance: dict,
        chunk_tokens: int = 256,
        shard_tokens: int = 16384,
        lock: StoreLock | None = None,
        precision: str = "lossless",
        writer_threads: int | str = "auto",
        shard_encoder: str = SHARD_ENCODER,
    ):
        self.path = Path(path)
        self._closed = False
        self._pool: Pool | None = None
        self._shard_files: TokenShardFiles | None = None
        if shard_encoder not in SHARD_ENCODERS:
            raise StoreError(f"{self.path}: shard_encoder must be one of {SHARD_ENCODERS}")
        self.shard_encoder = shard_encoder
        try:  # how many shard files a commit writes at once (eyrie/store/parallel.py)
            self.writer_threads = resolve_threads(writer_threads)
        except ValueError as exc:
            raise StoreError(f"{self.path}: {exc}") from None
        try:  # lossless, or bitround-N: N mantissa bits kept (eyrie/store/codecs.py)
            self.mantissa_bits = mantissa_bits(precision)
        except PrecisionError as exc:
            raise StoreError(f"{self.path}: {exc}") from None
        self.precision = precision_attrs(precision)
        self._check_params(hidden_size, aux_layer_ids, provenance, chunk_tokens, shard_tokens)
        self.hidden_size = int(hidden_size)
        self.aux_layer_ids = [int(i) for i in aux_layer_ids]
        self.provenance = json_normal(provenance, "provenance", self.path)
        if lock is not None and not (lock.held and lock.store == self.path):
            raise StoreError(f"{self.path}: the lock given is not held for this store")
        self._own_lock = lock is None
        self._store_lock = lock if lock is not None else StoreLock(self.path).acquire()
        self._buffer: list[tuple[str, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self._buffered_ids: set[str] = set()
        self._buffered_tokens = 0
        self._flushed: list[str] = []  # files a commit's pieces fsynced already (threads > 1)

        try:
            attrs = root_attrs(self.path) if self.path.is_dir() else None
            if attrs is None:
                if self.path.exists() and (not self.path.is_dir() or any(self.path.iterdir())):
                    raise StoreError(
                        f"{self.path} exists and is not an Eyrie shard store; remove it or "
                        "choose another output path"
                    )
                self._create(chunk_tokens, shard_tokens)
            self._remove_stale_creations()
            self._open_and_resume()
        except BaseException:
            self.close()
            raise

    # -- setup --------------------------------------------------------------------------------

    def _check_params(self, hidden_size, aux_layer_ids, provenance, chunk_tokens, shard_tokens):
        p = self.path

        def pos_int(x):
            return isinstance(x, int | np.integer) and not isinstance(x, bool) and x > 0

        if not pos_int(hidden_size):
            raise StoreError(f"{p}: hidden_size must be a positive int, got {hidden_size!r}")
        ids = list(aux_layer_ids) if isinstance(aux_layer_ids, list | tuple) else None
        if not ids or not all(isinstance(i, int | np.integer) and i >= 0 for i in ids):
            raise StoreError(
                f"{p}: aux_layer_ids must be a non-empty list of layer indices >= 0, "
                f"got {aux_layer_ids!r}"
            )
        if len(set(ids)) != len(ids):
            raise StoreError(f"{p}: aux_layer_ids {ids} repeats a layer; list each layer once")
        if not isinstance(provenance, dict):
            raise StoreError(f"{p}: provenance must be a dict, got {type(provenance).__name__}")
        if not (pos_int(chunk_tokens) and pos_int(shard_tokens)):
            raise StoreError(
                f"{p}: chunk_tokens and shard_tokens must be positive ints, got "
                f"{chunk_tokens!r} and {shard_tokens!r}"
            )
        if shard_tokens % chunk_tokens:
            raise StoreError(
                f"{p}: shard_tokens ({shard_tokens}) must be a multiple of chunk_tokens "
                f"({chunk_tokens}); e.g. extract.shard_tokens: {chunk_tokens * 64}"
            )

    def _remove_stale_creations(self) -> None:
        """Temp folders left by a writer killed while creating this store."""
        parent = self.path.parent
        if not parent.is_dir():
            return
        prefix = f".{self.path.name}.{OUR_TMP.lstrip('.')}-"
        for p in parent.iterdir():
            if p.name.startswith(prefix) and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)

    def _create(self, chunk_tokens: int, shard_tokens: int) -> None:
        """Build the empty store under a temp name, then rename it into place (all or nothing)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.parent / f".{self.path.name}.{OUR_TMP.lstrip('.')}-{uuid.uuid4().hex}"
        try:
            group = zarr.open_group(local_store(tmp, False), mode="w-", zarr_format=3)
            group.attrs.update(
                {
                    "eyrie_store_version": STORE_VERSION,
                    "aux_layer_ids": self.aux_layer_ids,
                    "layer_convention": "output",
                    "dtype": "bfloat16",
                    "hidden_size": self.hidden_size,
                    "chunk_tokens": int(chunk_tokens),
                    "shard_tokens": int(shard_tokens),
                    "complete": False,
                    "precision": self.precision,
                    "provenance": self.provenance,
                }
            )
            _create_arrays(
                group, len(self.aux_layer_ids), self.hidden_size, chunk_tokens, shard_tokens
            )
            write_json_durable(
                tmp / COMMIT_RECORD,
                {
                    "eyrie_store_version": STORE_VERSION,
                    "num_samples": 0,
                    "num_tokens": 0,
                    "sample_ids_sha256": ids_digest([]),
                },
            )
            fsync_tree(tmp, [str(f.relative_to(tmp)) for f in tmp.rglob("*") if f.is_file()])
            try:
                os.replace(tmp, self.path)  # also replaces an empty folder at self.path
                fsync(self.path.parent)
            except OSError:
                if root_attrs(self.path) is None:  # not another writer's fresh store
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def _open_and_resume(self) -> None:
        p = self.path
        attrs = root_attrs(p) or {}
        check_version(p, attrs)
        check_same_setup(p, attrs, self)
        self.chunk_tokens = int(attrs.get("chunk_tokens", 0))
        self.shard_tokens = int(attrs.get("shard_tokens", 0))
        self.complete = bool(attrs.get("complete", False))

        for root, _dirs, files in os.walk(p):  # temp files of a killed writer
            for name in files:
                if name.endswith(OUR_TMP) or ZARR_TMP.search(name):
                    os.unlink(os.path.join(root, name))

        rec = read_commit(p)
        n, t = int(rec["num_samples"]), int(rec["num_tokens"])
        self._group = zarr.open_group(local_store(p, False), mode="r+")
        self._arrays = {}
        for name in ALL_ARRAYS:
            try:
                with quiet_numcodecs():  # the bf16 arrays' numcodecs.shuffle (codecs.py)
                    arr = self._group[name]
            except KeyError:
                raise StoreError(
                    f"{p}: array {name!r} is missing; delete {p} and re-extract"
                ) from None
            self._arrays[name] = arr.with_config(_WRITE_CONFIG)
        want = committed_lengths(n, t)
        for name, arr in self._arrays.items():
            have = arr.shape[0]
            if have < want[name]:
                raise StoreError(
                    f"{p}: array {name} has {have} entries but {COMMIT_RECORD} commits "
                    f"{want[name]}; the store is damaged, delete {p} and re-extract"
                )
            if have > want[name]:
                if self.complete:
                    raise StoreError(
                        f"{p} is marked complete but {name} is longer than committed; the "
                        f"store is damaged, delete {p} and re-extract"
                    )
                arr.resize((want[name], *arr.shape[1:]))  # drop what was written past commit
        if self.shard_encoder == "eyrie":
            try:  # a layout it cannot reproduce byte for byte stays with zarr
                tokens = {name: self._arrays[name] for name in TOKEN_ARRAYS}
                self._shard_files = TokenShardFiles(p, tokens, self.writer_threads)
            except UnsupportedLayout:
                self._shard_files = None
        ids = [str(s) for s in self._arrays["sample_id"][:]] if n else []
        offsets = self._arrays["offsets"][:]
        if ids_digest(ids) != rec["sample_ids_sha256"] or int(offsets[-1]) != t:
            raise StoreError(
                f"{p}: sample ids or offsets disagree with {COMMIT_RECORD}; the store is "
                f"damaged, delete {p} and re-extract"
            )
        self.committed_ids: list[str] = ids
        self._committed_set = set(ids)
        self.num_samples = n
        self.num_tokens = t

    # -- public -------------------------------------------------------------------------------

    @property
    def buffered_samples(self) -> int:
        return len(self._buffer)

    @property
    def buffered_tokens(self) -> int:
        return self._buffered_tokens

    def append(
        self, sample_id: str, input_ids, loss_mask, aux_hidden, final_hidden, *, copy=True
    ) -> None:
        """Validate one sample and buffer it in memory (nothing is written until commit).

        The sample is copied, so the caller may reuse its buffers. ``copy=False`` hands the
        hidden states over instead: a caller whose buffers are never written again (the
        extractor's captured batches) saves a copy of every state it stores; arrays that
        share nothing with the caller's (a cast to bf16, a copy off the GPU) are never copied
        again either way.
        """
        p = self.path
        self._check_open()
        if self.complete:
            raise StoreError(
                f"{p} is complete (finished); appending {sample_id!r} would reopen it. "
                f"Delete {p} to re-extract, or write new samples to another shard"
            )
        if not isinstance(sample_id, str) or not sample_id:
            raise StoreError(f"{p}: sample_id must be a non-empty str, got {sample_id!r}")
        if sample_id in self._committed_set or sample_id in self._buffered_ids:
            raise StoreError(
                f"{p}: sample {sample_id!r} is already in this shard; skip ids in "
                "writer.committed_ids when resuming, and make dataset ids unique"
            )
        who = f"{p}: sample {sample_id!r}"
        ids = int_vector(input_ids, "input_ids", who)
        n_tok = ids.shape[0]
        if n_tok == 0:
            raise StoreError(f"{who} has no tokens; drop empty samples before extraction")
        if ids.min() < 0 or ids.max() > np.iinfo(np.int32).max:
            raise StoreError(f"{who}: input_ids must be token ids in [0, 2**31), got out-of-range")
        mask = int_vector(loss_mask, "loss_mask", who, allow_bool=True)
        if mask.shape[0] != n_tok:
            raise StoreError(f"{who}: loss_mask has {mask.shape[0]} tokens, input_ids {n_tok}")
        if mask.size and (mask.min() < 0 or mask.max() > 1):  # np.isin cost 35 us a sample
            raise StoreError(f"{who}: loss_mask must hold only 0/1 (or bool)")
        k, h = len(self.aux_layer_ids), self.hidden_size
        aux = self._owned_bits(aux_hidden, "aux_hidden", (n_tok, k, h), who, copy)
        fin = self._owned_bits(final_hidden, "final_hidden", (n_tok, h), who, copy)
        self._buffer.append((sample_id, ids.astype(np.int32), mask.astype(np.uint8), aux, fin))
        self._buffered_ids.add(sample_id)
        self._buffered_tokens += n_tok

    def commit(self) -> None:
        """Write buffered samples, then atomically replace the commit record (the commit point)."""
        if not self._buffer:
            return
        n0, t0 = self.num_samples, self.num_tokens
        batch = self._buffer
        new_ids = [b[0] for b in batch]
        lengths = np.array([b[1].shape[0] for b in batch], dtype=np.int64)
        n1, t1 = n0 + len(batch), t0 + int(lengths.sum())
        a = self._arrays
        resized = self._grow(t1, n1, t1 - t0, n1 - n0)
        starts = np.concatenate([[0], np.cumsum(lengths)])  # of each sample, from t0
        # one piece per shard file (several threads, or our own encoder), else one per array
        split = self.writer_threads > 1 or self._shard_files is not None
        spans_of = {"offsets": (n0, n1 + 1), "sample_id": (n0, n1)}
        touched = [f"{name}/zarr.json" for name in resized]
        for name, arr in a.items():
            lo, hi = spans_of.get(name, (t0, t1))
            touched += [f"{name}/{f}" for f in expected_chunk_files(arr, hi, lo)]
        existed = folders_present(self.path, touched)  # before the writes that may add some
        self._flushed = []
        jobs = [
            (lambda j=j, name=name, lo=lo, hi=hi: self._write_tokens(j, name, lo, hi, t0, starts))
            for j, name in enumerate(TOKEN_ARRAYS, start=1)
            for lo, hi in spans(t0, t1, self.shard_tokens, split)
        ]
        pool = self._threads()
        jobs.append(lambda: pool.setitem(a["offsets"], slice(n0 + 1, n1 + 1), t0 + starts[1:]))
        ids_value = np.array(new_ids, dtype=object)
        jobs.append(lambda: pool.setitem(a["sample_id"], slice(n0, n1), ids_value))
        pool.run(jobs)
        # Make the data durable before the commit record that points at it (power loss too):
        # every file the commit wrote (a grown array's zarr.json too; the group's zarr.json is
        # not touched by a commit) and the folders whose names changed. A file a piece already
        # flushed is not flushed twice; its folder still is, after it.
        fsync_tree(self.path, touched, each=pool.map, synced=set(self._flushed), existed=existed)
        ids = self.committed_ids + new_ids
        self._write_commit_record(n1, t1, ids)
        self.committed_ids = ids
        self._committed_set.update(new_ids)
        self.num_samples, self.num_tokens = n1, t1
        self._buffer, self._buffered_ids, self._buffered_tokens = [], set(), 0

    def finish(self) -> None:
        """Commit, then mark the store complete (readers accept only complete stores)."""
        self._check_open()
        self.commit()
        if self.complete:
            return
        n, t = self.num_samples, self.num_tokens
        want = committed_lengths(n, t)
        trimmed = [name for name, arr in self._arrays.items() if arr.shape[0] > want[name]]
        for name in trimmed:  # grown ahead by commits: a complete store is exactly as long
            arr = self._arrays[name]
            arr.resize((want[name], *arr.shape[1:]))
        fsync_tree(self.path, [f"{name}/zarr.json" for name in trimmed])
        self._group.attrs.update({"complete": True})  # zarr.json rewritten via temp + rename
        fsync_tree(self.path, ["zarr.json"])
        self.complete = True

    def close(self) -> None:
        """Release the store without committing what is buffered."""
        self._buffer = []
        self._buffered_ids = set()
        self._buffered_tokens = 0
        self._closed = True
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self._shard_files is not None:
            self._shard_files.close()
            self._shard_files = None
        if self._own_lock:
            self._store_lock.release()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self.commit()
        finally:
            self.close()

    # -- internals ----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"{self.path}: this writer is closed; open a new ShardWriter")

    def _threads(self) -> Pool:
        if self._pool is None:
            self._pool = Pool(self.writer_threads)
        return self._pool

    def _grow(self, t1: int, n1: int, tokens: int, samples: int) -> list[str]:
        """Lengthen the arrays this commit overflows, with room for GROW_AHEAD more like it.

        Why ahead: a resize rewrites the array's zarr.json (a zarr call, a file, its fsync and
        its folder's), and at every commit that cost more than a small commit's own data
        (benchmarks/RESULTS.md). The commit record, not an array's length, says what is valid
        (docs/store-format.md); finish() trims every array to it.
        """
        grown = []
        for name, length in committed_lengths(n1, t1).items():
            arr = self._arrays[name]
            if arr.shape[0] >= length:
                continue
            per_commit, step = (
                (tokens, self.shard_tokens) if name in TOKEN_ARRAYS else (samples, SAMPLE_CHUNK)
            )
            room = -(-(length + GROW_AHEAD * per_commit) // step) * step
            arr.resize((room, *arr.shape[1:]))
            grown.append(name)
        return grown

    def _write_tokens(self, j: int, name: str, lo: int, hi: int, t0: int, starts) -> None:
        """Write buffered field j of the samples over tokens [lo, hi) (one job of a commit).

        Only this span is gathered into one array, so memory stays bounded by the pieces
        running at once, not by the commit group.
        """
        if self._shard_files is not None:  # one shard file, chunk by chunk, fsynced already
            gather = partial(self._gather, j, t0=t0, starts=starts)
            self._flushed.append(self._shard_files.write(name, lo, hi, gather))
            return
        block = self._gather(j, lo, hi, t0, starts)
        pool = self._threads()
        pool.setitem(self._arrays[name], slice(lo, hi), block)
        if pool.threads > 1:  # flush now, while other pieces still compress (commit does the rest)
            for f in expected_chunk_files(self._arrays[name], hi, lo):
                fsync(self.path / name / f)
                self._flushed.append(f"{name}/{f}")

    def _gather(self, j: int, lo: int, hi: int, t0: int, starts) -> np.ndarray:
        """Buffered field j over tokens [lo, hi): a view when one sample holds them all."""
        first = int(np.searchsorted(starts, lo - t0, side="right")) - 1
        pieces, at = [], lo
        for k in range(first, len(self._buffer)):
            s0, s1 = t0 + int(starts[k]), t0 + int(starts[k + 1])
            if s0 >= hi:
                break
            pieces.append(self._buffer[k][j][max(at, s0) - s0 : min(hi, s1) - s0])
            at = min(hi, s1)
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def _write_commit_record(self, n: int, t: int, ids: list[str]) -> None:
        write_json_durable(
            self.path / COMMIT_RECORD,
            {
                "eyrie_store_version": STORE_VERSION,
                "num_samples": n,
                "num_tokens": t,
                "sample_ids_sha256": ids_digest(ids),
            },
        )

    def _owned_bits(self, x, name: str, shape: tuple, who: str, copy: bool) -> np.ndarray:
        """C-contiguous uint16 bf16 patterns for the buffer, rounded when the store is lossy.

        Copied only when they still share memory with the caller's input and the caller
        asked for a copy: a cast to bf16, a copy off the GPU or the lossy rounding already
        made a new array, and copying it again (as this once did) cost a pass over every state.
        """
        bits, fresh = input_bits(x, name, shape, who)
        if self.mantissa_bits is not None:  # the lossy precision: rounded before compression
            return round_bf16_bits(bits, self.mantissa_bits)
        if copy and not fresh:
            return np.array(bits, dtype=np.uint16, copy=True, order="C")
        return np.ascontiguousarray(bits)
