"""What a writer checks before it resumes a store: that the store was started by the same setup.

Resuming with another target, other aux layers, another precision or other provenance would
mix hidden states of two setups in one shard, so each is refused with the fix: delete the
store to re-extract, or run with what it was started with.
"""

from __future__ import annotations

from pathlib import Path

from eyrie.store.codecs import stored_mantissa_bits
from eyrie.store.format import StoreError


def check_same_setup(p: Path, attrs: dict, writer) -> None:
    """Raise StoreError unless the store's attributes are the writer's setup."""
    if attrs.get("hidden_size") != writer.hidden_size:
        raise StoreError(
            f"{p} holds hidden_size {attrs.get('hidden_size')}, this writer has "
            f"{writer.hidden_size}; delete {p} to re-extract for the new target, or use the "
            "target the store was started with"
        )
    if attrs.get("aux_layer_ids") != writer.aux_layer_ids:
        raise StoreError(
            f"{p} holds aux_layer_ids {attrs.get('aux_layer_ids')}, this writer has "
            f"{writer.aux_layer_ids}; delete {p} to re-extract with the new layers"
        )
    if stored_mantissa_bits(attrs) != writer.mantissa_bits:
        raise StoreError(
            f"{p} holds precision {attrs.get('precision', 'lossless')}, this writer "
            f"{writer.precision}; delete {p} to re-extract at the new precision"
        )
    old = attrs.get("provenance")
    if old != writer.provenance:
        keys = sorted(
            k
            for k in set(old or {}) | set(writer.provenance)
            if (old or {}).get(k) != writer.provenance.get(k)
        )
        raise StoreError(
            f"{p} was started with different provenance (differing keys: {keys}); resuming "
            f"would mix hidden states from two setups. Delete {p} to re-extract"
        )
