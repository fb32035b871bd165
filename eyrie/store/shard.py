"""The hidden-state shard store: one Zarr v3 store per shard, crash-safe and lossless.

Layout, codecs and the commit protocol are specified in docs/store-format.md; the format is
the contract, and these modules are one implementation of it:

- eyrie/store/format.py: array names, the commit record, bf16 bit patterns, durable writes;
- eyrie/store/writer.py: ShardWriter (append, commit, finish, resume after a kill);
- eyrie/store/shard_files.py: the token arrays' shard files, encoded as zarr writes them;
- eyrie/store/reader.py: ShardReader (one store by sample) and ShardDataset (many, for torch);
- eyrie/store/codecs.py: compressors and the lossy precision; eyrie/store/lock.py: one writer.

This module is the store's one import point for the other stages.
"""

from eyrie.store.format import (
    ALL_ARRAYS,
    COMMIT_RECORD,
    SAMPLE_ARRAYS,
    STORE_VERSION,
    TOKEN_ARRAYS,
    StoreError,
    bf16_bits,
    from_bf16_bits,
)
from eyrie.store.reader import ShardDataset, ShardReader
from eyrie.store.writer import ShardWriter

__all__ = [
    "ALL_ARRAYS",
    "COMMIT_RECORD",
    "SAMPLE_ARRAYS",
    "STORE_VERSION",
    "TOKEN_ARRAYS",
    "ShardDataset",
    "ShardReader",
    "ShardWriter",
    "StoreError",
    "bf16_bits",
    "from_bf16_bits",
]
