"""Check that a shard store holds exactly the target's hidden states, for every input sample.

A shard is compared with things that do not come from the extraction:
- its input: every sample of the shard is stored or listed in the errors table (none lost, none
  twice), and the stored token ids equal a fresh `apply_chat_template(tokenize=True)`;
- the store format: the store is complete, every chunk decodes (crc32c), offsets are consistent,
  no value is NaN/Inf, no token row is all zeros, the layer ids are the configured ones;
- the target: a seeded sample of stored samples (validate.spot_check_samples) is run through a
  plain transformers forward with output_hidden_states=True (not Eyrie's hooks), and every stored
  layer must match it in cosine similarity (hidden_states[i+1] is the output of layer i;
  hidden_states[-1] is after the final norm). On the same tokens, the lm_head weight read alone
  from the safetensors files must turn the stored final states into the forward's own greedy
  tokens (the rate must reach validate.min_greedy_match): a final state taken before the norm,
  or from the wrong layer, fails here even when it looks plausible. A store written with
  extract.precision bitround-N (its precision attribute) is held to a cosine bar relaxed by the
  rounding's bound (eyrie.store.codecs.cosine_bar: the angles of the two errors add), and its
  greedy tokens are compared with lm_head over the forward's final state rounded alike (rounding
  moves near-ties: the plain forward's own tokens would count those as misses); the report
  states the precision and the bar used. No check compares hidden-state bits exactly.

The stored states are read straight from the Zarr arrays rather than through the store's reader,
so each kind of damage is named by itself instead of as one refusal to open. Every problem is a
row (kind, sample_id, detail); rows of the extraction's errors table count too, as
"extract:<reason>". The summary fails the workflow when the total exceeds validate.max_errors.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from eyrie.common.hf_config import text_config
from eyrie.common.progress import bar as progress_bar
from eyrie.common.provenance import dir_bytes
from eyrie.data.errors_table import read_errors
from eyrie.data.split import read_split, shard_members
from eyrie.store.codecs import cosine_bar, stored_mantissa_bits
from eyrie.target.layers import resolve_aux_layer_ids
from eyrie.validate.problems import Problems
from eyrie.validate.recompute import lm_head_weight, spot_check
from eyrie.validate.settings import ValidateSettings
from eyrie.validate.store import check_structure, check_values, iter_samples, open_raw


def _seed(split: str, shard: int, seed: int) -> int:
    return int(hashlib.sha256(f"{seed}/{split}/{shard}".encode()).hexdigest()[:8], 16)


def reference_ids(tokenizer, messages: list[dict], max_tokens: int, full=None) -> list[int]:
    """The input ids as transformers' own chat tokenization gives them, cut to max_tokens
    (`full`, a list, gets the length before the cut)."""
    out = tokenizer.apply_chat_template(messages, tokenize=True)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    if full is not None:
        full.append(len(ids))
    return [int(i) for i in ids[:max_tokens]]


def check_membership(members, listed: dict, stored: set, p: Problems) -> tuple[dict, int]:
    """Every input sample of the shard is stored or listed in the errors table, exactly once.

    Returns the first record of each sample id (a repeated id is the extraction's
    duplicate_id) and how many samples the store should hold.
    """
    by_line = {r.line: r for r in members}
    first_ids = {r.sample_id: r for r in members if r.error is None or r.error[0] != "duplicate_id"}
    for line, (sid, reason, _) in listed.items():
        rec = by_line.get(line)
        if rec is None or rec.sample_id != sid:
            p.add("unexpected", sid, f"listed at line {line}, which is not this shard's sample")
        elif sid in stored and reason != "duplicate_id":
            p.add("stored_and_listed", sid, f"stored and listed as {reason}")
    for sid in sorted(stored - set(first_ids)):
        p.add("unexpected", sid, "stored, but not an input sample of this shard")
    for rec in members:
        if rec.sample_id in first_ids and first_ids[rec.sample_id] is rec:
            if rec.sample_id not in stored and rec.line not in listed:
                p.add("missing", rec.sample_id, f"line {rec.line} is neither stored nor listed")
        elif rec.line not in listed:
            p.add("missing", rec.sample_id, f"line {rec.line} (a repeated id) is not listed")
    expected = sum(1 for r in members if first_ids.get(r.sample_id) is r and r.line not in listed)
    return first_ids, expected


def validate_shard(
    *,
    store: str | Path,
    errors_csv: str | Path,
    data_path: str | Path,
    target_path: str | Path,
    split: str,
    shard: int,
    shards: int,
    max_tokens: int,
    settings: ValidateSettings,
    aux_layer_ids=None,
    device: str = "auto",
    architecture: str | None = None,
    seed: int = 0,
    progress: bool = False,
) -> dict:
    """A report (a JSON-ready dict) of one shard; problems are listed, never raised. The bars
    are ``settings``'s (validate.spot_check_samples, min_cosine, min_greedy_match)."""
    from eyrie.store.shard import ShardReader, StoreError
    from eyrie.target.load import load_target, load_tokenizer, num_hidden_layers, read_config

    store, errors_csv = Path(store), Path(errors_csv)
    p = Problems()
    members = shard_members(read_split(data_path), shard, shards)
    tokenizer = load_tokenizer(target_path)
    hidden = int(text_config(read_config(target_path))["hidden_size"])
    expected_aux = resolve_aux_layer_ids(aux_layer_ids, num_hidden_layers(target_path))

    if errors_csv.is_file():
        try:
            listed = read_errors(errors_csv)
        except (KeyError, ValueError) as exc:
            p.add("errors_table", None, f"{errors_csv}: {exc}")
            listed = {}
    else:
        p.add("errors_table", None, f"{errors_csv} does not exist")
        listed = {}
    for line, (sid, reason, detail) in listed.items():
        p.add(f"extract:{reason}", sid, f"line {line}: {detail}")

    raw = open_raw(store, p)
    report = {
        "split": split,
        "shard": f"{shard:03d}",
        "store": str(store),
        "errors_csv": str(errors_csv),
        "samples": 0,
        "tokens": 0,
        "expected_samples": None,
        "expected_tokens": 0,
        "truncated": 0,  # stored samples cut at dataset.max_tokens (counted, not an error)
    }
    sliceable = False
    if raw is not None:
        sliceable = check_structure(raw, expected_aux, hidden, p)
        report.update(samples=raw.n, tokens=raw.t)
        try:
            ShardReader(store, require_complete=True)
        except StoreError as exc:
            if not (set(p.counts) & {"incomplete", "offsets", "duplicate", "checksum"}):
                p.add("store", None, str(exc))

    stored = set(raw.sample_ids or []) if raw is not None else set()
    first_ids, report["expected_samples"] = check_membership(members, listed, stored, p)

    # values, against an independent re-tokenization
    decoded = []
    if sliceable:
        meter = progress_bar(
            total=raw.n, desc=f"validate {split}/{shard:03d}", unit="sample", disable=not progress
        )
        for s, sid, arr in iter_samples(raw, p):
            meter.update(1)
            rec = first_ids.get(sid)
            ref = None
            if rec is not None and rec.messages:
                try:
                    full: list[int] = []
                    ref = reference_ids(tokenizer, rec.messages, max_tokens, full)
                    report["expected_tokens"] += len(ref)
                    report["truncated"] += full[0] > max_tokens
                except Exception as exc:
                    p.add("input_ids", sid, f"re-tokenization failed: {exc}")
            check_values(sid, arr, ref, p)
            decoded.append(s)
        meter.close()

    # the target itself; a lossy store (attribute precision) is held to a bar relaxed by the
    # rounding's known bound (eyrie/store/codecs.py)
    keep = stored_mantissa_bits(raw.attrs) if raw is not None else None
    bar = cosine_bar(settings.min_cosine, keep)
    report.update(spot_checked=[], cosine={}, min_cosine=None, greedy_match=None, greedy_tokens=0)
    report.update(
        precision=(raw.attrs.get("precision") if raw is not None else None) or {"kind": "lossless"},
        cosine_bar=bar,
    )
    if decoded and settings.spot_check_samples > 0:
        rng = np.random.default_rng(_seed(split, shard, seed))
        k = min(settings.spot_check_samples, len(decoded))
        picks = sorted(rng.choice(decoded, size=k, replace=False).tolist())
        target = load_target(target_path, device=device, architecture=architecture)
        lm_head = lm_head_weight(target_path)
        report.update(
            spot_check(
                raw, picks, target, expected_aux, lm_head, p, bar, settings.min_greedy_match, keep
            )
        )

    # sizes
    k = len(expected_aux)
    stored_bytes = dir_bytes(store)
    hidden_bytes = dir_bytes(store / "aux_hidden") + dir_bytes(store / "final_hidden")
    raw_bytes = report["tokens"] * (k + 1) * hidden * 2
    report.update(
        bytes_stored=stored_bytes,
        bytes_per_token=stored_bytes / report["tokens"] if report["tokens"] else None,
        raw_bf16_bytes=raw_bytes,
        compression_ratio=raw_bytes / hidden_bytes if hidden_bytes else None,
        aux_layer_ids=expected_aux,
        errors=sum(p.counts.values()),
        error_counts=dict(sorted(p.counts.items())),
        problems=p.rows,
    )
    return report
