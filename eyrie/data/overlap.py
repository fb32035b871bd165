"""Held-out samples that are training samples too: found before extraction, and refused.

A held-out figure (acc_k, accept length, speed-up) measured on samples the drafter trained on
says nothing about held-out data, and no later stage can tell. Two samples are the same when
they share an id (stores keep samples by id; validation counts an id stored twice as an error)
or when they render the same text: the same roles and contents in the same order, each content
trimmed of surrounding whitespace as chat templates trim it. That key is the conversation a
template renders, without needing the target's tokenizer, so the check runs right after the
data stage, before any GPU time.

After regeneration (regenerate.enabled) the assistant turns are the target's answers to the
prompts, not data of their own: two conversations with the same prompts (their system and user
turns, in order) get the same answers under greedy decoding, and answers drawn from the same
distribution when sampling, so there the key is the prompts alone. The prepared splits are
checked with that key when regeneration follows (a clash stops the run before any generation),
and the regenerated splits, which extraction reads, are checked again.

dataset.allow_overlap: true turns the refusal into a count in the written report.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from eyrie.common.atomic import write_json
from eyrie.common.errors import EyrieError

log = logging.getLogger(__name__)

KEYS = ("conversation", "prompts")
SHOWN = 3  # shared samples named in the message
ALLOW = "set dataset.allow_overlap: true to run anyway (the overlap is then only counted)"


class OverlapError(EyrieError, ValueError):
    """Held-out samples that are also train samples; the message names both files and them."""


def sample_key(messages: list[dict], key: str = "conversation") -> str:
    """sha256 of what a chat template renders of the messages (key "prompts": of their system
    and user turns only)."""
    kept = [
        [m["role"], m["content"].strip()]
        for m in messages
        if key == "conversation" or m["role"] != "assistant"
    ]
    return hashlib.sha256(json.dumps(kept, ensure_ascii=False).encode()).hexdigest()


@dataclass(frozen=True)
class Shared:
    """A held-out sample and the first train sample it equals."""

    heldout_id: str
    heldout_at: str  # FILE:LINE in the configured dataset file
    train_id: str
    train_at: str
    same: tuple[str, ...]  # what these two share: "id" and/or the key's name
    matched: tuple[str, ...]  # what the held-out sample shares with any train sample

    def describe(self) -> str:
        return (
            f'"{self.heldout_id}" ({self.heldout_at}) = "{self.train_id}" ({self.train_at}), '
            f"same {' and '.join(self.same)}"
        )


def read_records(path: str | Path) -> list[dict]:
    """A prepared or regenerated split: one {"id", "messages", "source"} object per line."""
    try:
        # by "\n" only: str.splitlines() also cuts at U+2028 and the like, which JSON strings
        # hold unescaped (ShareGPT's do)
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, json.JSONDecodeError) as exc:
        raise OverlapError(f"cannot read the split {path}: {exc}; rerun its stage") from None


def _where(record: dict, path: str | Path, index: int) -> str:
    return str(record.get("source") or f"{path}:{index + 1}")


def find_shared(train: list[dict], heldout: list[dict], key: str, paths=("", "")) -> list[Shared]:
    """Every held-out record that equals a train record by id or by `key`, in held-out order."""
    by_id = {str(r["id"]): (i, r) for i, r in reversed(list(enumerate(train)))}
    by_key = {sample_key(r["messages"], key): (i, r) for i, r in reversed(list(enumerate(train)))}
    shared = []
    for j, rec in enumerate(heldout):
        same_id = by_id.get(str(rec["id"]))
        same_key = by_key.get(sample_key(rec["messages"], key))
        if same_id is None and same_key is None:
            continue
        i, match = same_id or same_key
        hits = [(name, hit) for name, hit in (("id", same_id), (key, same_key)) if hit]
        shared.append(
            Shared(
                str(rec["id"]),
                _where(rec, paths[1], j),
                str(match["id"]),
                _where(match, paths[0], i),
                tuple(name for name, hit in hits if hit[0] == i),
                tuple(name for name, _ in hits),
            )  # fmt: skip
        )
    return shared


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_overlap(
    train_path: str | Path,
    heldout_path: str | Path,
    out: str | Path,
    *,
    sources: dict[str, str],
    key: str = "conversation",
    allow: bool = False,
    regenerated: bool = False,
) -> dict:
    """Compare the two splits; raise OverlapError on a shared sample unless `allow`, else write
    the counts to `out` (JSON) and return them.

    `sources` are the configured files (dataset.train, dataset.heldout), which the message
    names; `regenerated` says the splits are the regenerated ones.
    """
    if key not in KEYS:
        raise ValueError(f"key must be one of {KEYS}, got {key!r}")
    train, heldout = read_records(train_path), read_records(heldout_path)
    shared = find_shared(train, heldout, key, (train_path, heldout_path))
    report = {
        "key": key,
        "splits": "regenerated" if regenerated else "prepared",
        "train": {"file": sources["train"], "samples": len(train)},
        "heldout": {"file": sources["heldout"], "samples": len(heldout)},
        "shared": len(shared),
        "shared_by_id": sum("id" in s.matched for s in shared),
        f"shared_by_{key}": sum(key in s.matched for s in shared),
        "first": [
            {
                "heldout": [s.heldout_id, s.heldout_at],
                "train": [s.train_id, s.train_at],
                "same": list(s.same),
            }
            for s in shared[:SHOWN]
        ],  # fmt: skip
        "allowed": bool(allow),
    }
    if shared and not allow:
        raise OverlapError(_message(report, shared, sources, key, regenerated))
    if shared:
        log.warning(
            "dataset.allow_overlap is true: %d of %d held-out samples are also train samples; "
            "held-out figures include them",
            len(shared),
            len(heldout),
        )
    else:
        log.info("no held-out sample is a train sample (%s key)", key)
    write_json(out, report)
    return report


def _message(report: dict, shared: list[Shared], sources: dict, key: str, regenerated: bool):
    train, held = sources["train"], sources["heldout"]
    n, total = len(shared), report["heldout"]["samples"]
    what = {"conversation": "conversation", "prompts": "prompts (system and user turns)"}[key]
    if _same_file(train, held):
        head = f"dataset.train and dataset.heldout are the same file, {train}: "
    else:
        head = f"dataset.heldout ({held}) and dataset.train ({train}) overlap: "
    when = " after regeneration" if regenerated else ""
    listed = "; ".join(s.describe() for s in shared[:SHOWN])
    listed += f"; and {n - SHOWN} more" if n > SHOWN else ""
    if not report[f"shared_by_{key}"]:  # ids only: other text under the same ids
        return (
            f"{head}{n} of the {total} held-out samples{when} have the id of a train sample, "
            f"with another {what.split(' (')[0]}; stores keep samples by id, and validation "
            f"counts an id stored in both splits as an error. Shared ids (held-out = train): "
            f"{listed}. Give the held-out samples ids of their own, or {ALLOW}."
        )
    why = "; the target's answers to the same prompts are training data too"
    why = why if key == "prompts" else ""
    return (
        f"{head}{n} of the {total} held-out samples{when} are train samples "
        f"({report['shared_by_id']} with the same id, {report[f'shared_by_{key}']} with the same "
        f"{what}{why}), so held-out figures would be measured on training data. "
        f"Shared (held-out = train): {listed}. Point dataset.heldout at samples that are not "
        f"in dataset.train (or remove these from one file), or {ALLOW}."
    )
