"""The problems a validation finds: one row each (kind, sample_id, detail), and the kinds' meanings.

Problems are listed, never raised, so one run names every kind of damage at once; the counts
are always complete, the rows capped so a badly broken store still gives a small report.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

KINDS = {
    "unreadable": "the store cannot be opened as an Eyrie shard store",
    "incomplete": "the store is not marked complete (its extraction did not finish)",
    "attrs": "layer convention, dtype or hidden size differ from the contract or the target",
    "aux_layer_ids": "the stored layer ids are not the configured ones",
    "store": "the store reader refuses the store",
    "checksum": "a chunk does not decode (crc32c mismatch, damaged or missing file)",
    "offsets": "offsets are not 0, increasing, and ending at the token count",
    "duplicate": "a sample id is stored twice",
    "missing": "an input sample of the shard is neither stored nor in the errors table",
    "unexpected": "a stored or listed sample that is not an input of this shard",
    "stored_and_listed": "a sample is both stored and in the errors table",
    "length": "the stored token count differs from the re-tokenized input",
    "input_ids": "stored token ids differ from the re-tokenized input",
    "loss_mask": "the loss mask is not 0/1 or marks no token",
    "non_finite": "a stored value is NaN or Inf",
    "zero_rows": "a token's stored state is all zeros",
    "cosine": "a spot-checked layer is below validate.min_cosine (relaxed by the rounding bound "
    "for a bitround store) against a plain forward",
    "greedy": "lm_head over the final states misses the target's greedy tokens too often",
    "cross_shard": "a sample is stored in more than one shard",
    "errors_table": "the extraction's errors table is missing or unreadable",
}
MAX_LISTED = 1000  # problem rows kept in a report; counts are always complete


@dataclass
class Problems:
    rows: list = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)

    def add(self, kind: str, sample_id: str | None = None, detail: str = "") -> None:
        self.counts[kind] += 1
        if len(self.rows) < MAX_LISTED:
            self.rows.append({"kind": kind, "sample_id": sample_id, "detail": detail})
