"""A split file and one shard's members: what extraction reads, and validation reads again.

Shard membership is round-robin: sample j of the split (its j-th non-blank line, 0-based) is in
shard j % S. It is deterministic, needs no pass over lengths, and spreads long and short samples
evenly when the data is sorted by source or size. A line that cannot be used (bad JSON, no id, a
repeated id, no messages) becomes an error record, so it is listed in the errors table instead
of dropped; `source` is the sample's FILE:LINE in the user's dataset, as prepare_dataset
recorded it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from eyrie.common.errors import ExtractError


@dataclass
class Record:
    line: int  # 1-based line of the split file
    sample_id: str
    messages: list | None
    error: tuple[str, str] | None = None  # (reason, detail) when the line is unusable
    source: str = ""  # "FILE:LINE" of the user's file (prepare_dataset), else of the split file


def read_split(path: str | Path) -> list[Record]:
    """Every line of a split file as a Record; a repeated id or a bad line is an error record."""
    path = Path(path)
    if not path.is_file():
        # regenerate.enabled: the split is rule regenerate's output (Layout.regenerated)
        rule = "regenerate" if path.parent.name == "regen" else "prepare_dataset"
        raise ExtractError(f"split file {path} does not exist; run the {rule} rule")
    records, seen = [], {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f):
            if not line.strip():
                continue
            where = f"{path}:{n + 1}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                bad = ("bad_line", str(exc))
                records.append(Record(n + 1, f"line:{n + 1}", None, bad, where))
                continue
            sid, msgs = obj.get("id") if isinstance(obj, dict) else None, None
            if isinstance(obj, dict):
                msgs = obj.get("messages")
                src = obj.get("source")
                where = src if isinstance(src, str) and src else where
            if not isinstance(sid, str) or not sid:
                records.append(Record(n + 1, f"line:{n + 1}", None, ("bad_line", "no id"), where))
                continue
            rec = Record(n + 1, sid, msgs, source=where)
            if sid in seen:
                rec.error = ("duplicate_id", f"{where} repeats the id of line {seen[sid]}")
            elif not isinstance(msgs, list) or not msgs:
                rec.error = ("bad_line", f"{where} has no 'messages' list")
            else:
                seen[sid] = n + 1
            records.append(rec)
    return records


def shard_members(records: list, shard: int, shards: int) -> list:
    """The records of one shard: sample j (j-th non-blank line) with j % shards == shard."""
    if not 0 <= shard < shards:
        raise ExtractError(f"shard {shard} is out of range for extract.shards = {shards}")
    return [r for j, r in enumerate(records) if j % shards == shard]
