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
import json
import os
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from eyrie.extract.shard import read_errors, read_split, resolve_aux_layer_ids, shard_members
from eyrie.store.codecs import cosine_bar, round_bf16_bits, stored_mantissa_bits

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
EXP_MASK, MAG_MASK = np.uint16(0x7F80), np.uint16(0x7FFF)


@dataclass
class Problems:
    rows: list = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)

    def add(self, kind: str, sample_id: str | None = None, detail: str = "") -> None:
        self.counts[kind] += 1
        if len(self.rows) < MAX_LISTED:
            self.rows.append({"kind": kind, "sample_id": sample_id, "detail": detail})


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """Exact float32 values of bf16 bit patterns (numpy only)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _seed(split: str, shard: int, seed: int) -> int:
    return int(hashlib.sha256(f"{seed}/{split}/{shard}".encode()).hexdigest()[:8], 16)


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def reference_ids(tokenizer, messages: list[dict], max_tokens: int, full=None) -> list[int]:
    """The input ids as transformers' own chat tokenization gives them, cut to max_tokens
    (`full`, a list, gets the length before the cut)."""
    out = tokenizer.apply_chat_template(messages, tokenize=True)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    if full is not None:
        full.append(len(ids))
    return [int(i) for i in ids[:max_tokens]]


# ---------------------------------------------------------------------------------------------
# the store, read raw


@dataclass
class RawStore:
    path: Path
    attrs: dict
    n: int
    t: int
    arrays: dict
    sample_ids: list | None = None
    offsets: np.ndarray | None = None


def open_raw(path: Path, problems: Problems) -> RawStore | None:
    import zarr

    from eyrie.validate.advice import half_deleted

    if not path.is_dir():
        problems.add("unreadable", None, f"{path} does not exist; extract this shard")
        return None
    if why := half_deleted(path):
        problems.add("unreadable", None, f"{why}; delete it and extract this shard again")
        return None
    try:
        group = zarr.open_group(zarr.storage.LocalStore(str(path), read_only=True), mode="r")
        attrs = dict(group.attrs)
        commit = json.loads((path / "commit.json").read_text())
        n, t = int(commit["num_samples"]), int(commit["num_tokens"])
        arrays = {
            k: group[k]
            for k in (
                "input_ids",
                "loss_mask",
                "aux_hidden",
                "final_hidden",
                "offsets",
                "sample_id",
            )
        }
    except Exception as exc:  # any failure here means the store cannot be used at all
        problems.add("unreadable", None, f"{path}: {type(exc).__name__}: {exc}")
        return None
    return RawStore(path, attrs, n, t, arrays)


def check_structure(raw: RawStore, expected_aux: list[int], hidden: int, p: Problems) -> bool:
    """Attributes, offsets and ids; True when samples can be sliced by offsets."""
    a = raw.attrs
    if not a.get("complete", False):
        p.add("incomplete", None, f"{raw.path} is not complete; rerun its extract job")
    if a.get("aux_layer_ids") != expected_aux:
        p.add("aux_layer_ids", None, f"stored {a.get('aux_layer_ids')}, configured {expected_aux}")
    for key, want in (
        ("layer_convention", "output"),
        ("dtype", "bfloat16"),
        ("hidden_size", hidden),
    ):
        if a.get(key) != want:
            p.add("attrs", None, f"{key} is {a.get(key)!r}, expected {want!r}")
    k = len(a.get("aux_layer_ids") or [])
    shapes = {
        "input_ids": (raw.t,),
        "loss_mask": (raw.t,),
        "aux_hidden": (raw.t, k, hidden),
        "final_hidden": (raw.t, hidden),
        "offsets": (raw.n + 1,),
        "sample_id": (raw.n,),
    }
    sliceable = True
    for name, shape in shapes.items():
        have = raw.arrays[name].shape
        longer = a.get("complete", False) and have[0] > shape[0]  # a finished store is exact
        if have[1:] != shape[1:] or have[0] < shape[0] or longer:
            p.add("offsets", None, f"array {name} has shape {have}, the commit needs {shape}")
            sliceable = False
    if not sliceable:
        return False
    try:
        raw.offsets = np.asarray(raw.arrays["offsets"][: raw.n + 1], dtype=np.int64)
        raw.sample_ids = [str(s) for s in raw.arrays["sample_id"][: raw.n]] if raw.n else []
    except Exception as exc:
        p.add("checksum", None, f"offsets or sample_id do not decode: {exc}")
        return False
    off = raw.offsets
    bad = []
    if off[0] != 0:
        bad.append(f"offsets[0] is {off[0]}")
    if off[-1] != raw.t:
        bad.append(f"offsets[-1] is {off[-1]}, the store holds {raw.t} tokens")
    steps = np.flatnonzero(np.diff(off) <= 0)
    if len(steps):
        bad.append(f"offsets do not increase at samples {steps[:5].tolist()}")
    for msg in bad:
        p.add("offsets", None, msg)
    for sid, n in Counter(raw.sample_ids).items():
        for _ in range(n - 1):
            p.add("duplicate", sid, f"stored {n} times")
    return not bad


def _read_rows(raw: RawStore, lo: int, hi: int) -> dict:
    a = raw.arrays
    return {
        name: a[name][lo:hi] for name in ("input_ids", "loss_mask", "aux_hidden", "final_hidden")
    }


def iter_samples(raw: RawStore, p: Problems, block_tokens: int = 4096):
    """(index, sample_id, arrays) for each sample that decodes; decode failures are problems."""
    off, ids = raw.offsets, raw.sample_ids
    i = 0
    while i < raw.n:
        j = i + 1
        while j < raw.n and off[j + 1] - off[i] <= block_tokens:
            j += 1
        try:
            block = _read_rows(raw, int(off[i]), int(off[j]))
            parts = [
                (s, {k: v[off[s] - off[i] : off[s + 1] - off[i]] for k, v in block.items()})
                for s in range(i, j)
            ]
        except Exception:  # find which samples of the block are damaged
            parts = []
            for s in range(i, j):
                arrays, bad = {}, []
                for name in ("input_ids", "loss_mask", "aux_hidden", "final_hidden"):
                    try:
                        arrays[name] = raw.arrays[name][int(off[s]) : int(off[s + 1])]
                    except Exception as exc:
                        text = str(exc) or type(exc).__name__
                        bad.append(f"{name}: {text[:1].lower()}{text[1:]}")
                if bad:
                    p.add("checksum", ids[s], "; ".join(bad))
                else:
                    parts.append((s, arrays))
        for s, arrays in parts:
            yield s, ids[s], arrays
        i = j


def check_values(sid: str, arr: dict, ref: list[int] | None, p: Problems) -> None:
    ids = np.asarray(arr["input_ids"])
    if ref is not None:
        if len(ids) != len(ref):
            p.add("length", sid, f"stored {len(ids)} tokens, re-tokenized {len(ref)}")
        elif not np.array_equal(ids, np.asarray(ref, dtype=ids.dtype)):
            first = int(np.flatnonzero(ids != np.asarray(ref, dtype=ids.dtype))[0])
            p.add("input_ids", sid, f"first differing token at position {first}")
    mask = np.asarray(arr["loss_mask"])
    if not np.isin(mask, (0, 1)).all() or not mask.any():
        p.add("loss_mask", sid, "values other than 0/1, or no token marked")
    for name in ("aux_hidden", "final_hidden"):
        bits = np.asarray(arr[name])
        if ((bits & EXP_MASK) == EXP_MASK).any():
            p.add("non_finite", sid, f"{name} holds NaN or Inf")
        zero = ((bits & MAG_MASK) == 0).all(axis=-1)
        if zero.any():
            where = np.argwhere(zero)[0].tolist()
            p.add("zero_rows", sid, f"{name} has {int(zero.sum())} all-zero rows, first at {where}")


# ---------------------------------------------------------------------------------------------
# the target: lm_head alone, and a plain forward


def lm_head_weight(target_path: str | Path) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The output projection read alone from safetensors (the input embedding when tied)."""
    from safetensors import safe_open

    from eyrie.target.load import TargetError, weight_files

    found: dict[str, tuple[Path, str]] = {}
    for f in weight_files(target_path):
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():  # noqa: SIM118 - safe_open is not a dict
                for want in ("lm_head.weight", "lm_head.bias", "embed_tokens.weight"):
                    if key == want or key.endswith("." + want):
                        found.setdefault(want, (f, key))
    name = "lm_head.weight" if "lm_head.weight" in found else "embed_tokens.weight"
    if name not in found:
        raise TargetError(f"target.path: no lm_head.weight or embed_tokens.weight in {target_path}")

    def load(which):
        if which not in found:
            return None
        f, key = found[which]
        with safe_open(str(f), framework="pt") as st:
            return st.get_tensor(key)

    return load(name), load("lm_head.bias")


def spot_check(
    raw, picks, target, aux_ids, lm_head, p: Problems, min_cosine, min_greedy, keep=None
) -> dict:
    """Cosine per stored layer vs output_hidden_states, and greedy tokens via lm_head alone."""
    import torch.nn.functional as F

    model, dev = target.model, target.device
    num_layers = model.config.get_text_config().num_hidden_layers
    w, b = (t.to(dev, torch.float32) if t is not None else None for t in lm_head)
    names = [f"aux_{i}" for i in aux_ids] + ["final"]
    worst = dict.fromkeys(names, 1.0)
    match = total = 0
    for s in picks:
        arr = _read_rows(raw, int(raw.offsets[s]), int(raw.offsets[s + 1]))
        ids = torch.as_tensor(np.asarray(arr["input_ids"], dtype=np.int64), device=dev)[None]
        with torch.inference_mode():
            out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
        aux = torch.from_numpy(bf16_to_f32(np.asarray(arr["aux_hidden"]))).to(dev)
        final = torch.from_numpy(bf16_to_f32(np.asarray(arr["final_hidden"]))).to(dev)
        pairs = [
            (f"aux_{i}", aux[:, j], out.hidden_states[i + 1][0])
            for j, i in enumerate(aux_ids)
            if i < num_layers - 1
        ]  # hidden_states[L] is after the final norm
        pairs.append(("final", final, out.hidden_states[-1][0]))
        for name, got, ref in pairs:
            cos = F.cosine_similarity(got.float(), ref.float(), dim=-1, eps=1e-12)
            worst[name] = min(worst[name], float(cos.min()))
        logits = final @ w.T + (b if b is not None else 0)
        want = out.logits[0].float().argmax(-1)
        if keep is not None:  # a rounded store: the forward's own final state, rounded alike
            ref = _rounded(out.hidden_states[-1][0], keep).to(dev)
            want = (ref @ w.T + (b if b is not None else 0)).argmax(-1)
        match += int((logits.argmax(-1) == want).sum())
        total += ids.shape[1]
    for name, value in worst.items():
        if picks and value < min_cosine:
            p.add("cosine", None, f"{name}: min cosine {value:.6f} < {min_cosine}")
    rate = match / total if total else None
    if rate is not None and rate < min_greedy:
        p.add("greedy", None, f"{match}/{total} greedy tokens ({rate:.4f}) < {min_greedy}")
    checked = [n for n in names if n == "final" or int(n[4:]) < num_layers - 1]
    return {
        "spot_checked": [raw.sample_ids[s] for s in picks],
        "cosine": {n: worst[n] for n in checked} if picks else {},
        "min_cosine": min((worst[n] for n in checked), default=None) if picks else None,
        "greedy_match": rate,
        "greedy_tokens": total,
    }


def _rounded(states: torch.Tensor, keep: int) -> torch.Tensor:
    """float32 of bf16 states rounded to `keep` mantissa bits, as a bitround store holds them."""
    from eyrie.store.shard import bf16_bits

    bits = round_bf16_bits(bf16_bits(states.float().cpu()), keep)
    return torch.from_numpy(bf16_to_f32(bits))


# ---------------------------------------------------------------------------------------------
# one shard


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
    aux_layer_ids=None,
    spot_check_samples: int = 4,
    min_cosine: float = 0.999,
    min_greedy_match: float = 0.98,
    device: str = "auto",
    architecture: str | None = None,
    seed: int = 0,
) -> dict:
    """A report (a JSON-ready dict) of one shard; problems are listed, never raised."""
    from eyrie.store.shard import ShardReader, StoreError
    from eyrie.target.load import load_target, load_tokenizer, num_hidden_layers, read_config

    store, errors_csv = Path(store), Path(errors_csv)
    p = Problems()
    members = shard_members(read_split(data_path), shard, shards)
    tokenizer = load_tokenizer(target_path)
    cfg = read_config(target_path)
    hidden = int(cfg.get("text_config", cfg)["hidden_size"])
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

    # membership: every sample of the shard is stored or listed, exactly once
    stored = set(raw.sample_ids or []) if raw is not None else set()
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
    report["expected_samples"] = sum(
        1 for r in members if first_ids.get(r.sample_id) is r and r.line not in listed
    )

    # values, against an independent re-tokenization
    decoded = []
    if sliceable:
        for s, sid, arr in iter_samples(raw, p):
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

    # the target itself; a lossy store (attribute precision) is held to a bar relaxed by the
    # rounding's known bound (eyrie/store/codecs.py)
    keep = stored_mantissa_bits(raw.attrs) if raw is not None else None
    bar = cosine_bar(min_cosine, keep)
    report.update(spot_checked=[], cosine={}, min_cosine=None, greedy_match=None, greedy_tokens=0)
    report.update(
        precision=(raw.attrs.get("precision") if raw is not None else None) or {"kind": "lossless"},
        cosine_bar=bar,
    )
    if decoded and spot_check_samples > 0:
        rng = np.random.default_rng(_seed(split, shard, seed))
        k = min(spot_check_samples, len(decoded))
        picks = sorted(rng.choice(decoded, size=k, replace=False).tolist())
        target = load_target(target_path, device=device, architecture=architecture)
        lm_head = lm_head_weight(target_path)
        report.update(
            spot_check(raw, picks, target, expected_aux, lm_head, p, bar, min_greedy_match, keep)
        )

    # sizes
    k = len(expected_aux)
    stored_bytes = _dir_bytes(store)
    hidden_bytes = _dir_bytes(store / "aux_hidden") + _dir_bytes(store / "final_hidden")
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


# ---------------------------------------------------------------------------------------------
# all shards


def cross_shard(reports: list[dict]) -> None:
    """Add a cross_shard problem to a report for each sample another shard also stores."""
    import zarr

    owner: dict[str, str] = {}
    for rep in reports:
        try:
            group = zarr.open_group(zarr.storage.LocalStore(rep["store"], read_only=True), mode="r")
            n = int(json.loads((Path(rep["store"]) / "commit.json").read_text())["num_samples"])
            ids = [str(s) for s in group["sample_id"][:n]] if n else []
        except Exception:
            continue  # already reported as unreadable by the shard's own check
        where = f"{rep['split']}/{rep['shard']}"
        for sid in set(ids):
            if sid in owner:
                counts = rep.setdefault("error_counts", {})
                counts["cross_shard"] = counts.get("cross_shard", 0) + 1
                rep["errors"] = rep.get("errors", 0) + 1
                rep.setdefault("problems", []).append(
                    {"kind": "cross_shard", "sample_id": sid, "detail": f"also in {owner[sid]}"}
                )
            else:
                owner[sid] = where


def summary_table(reports: list[dict]) -> pd.DataFrame:
    """One row per (split, shard) and a total row."""
    rows = []
    for r in sorted(reports, key=lambda r: (r["split"], r["shard"])):
        rows.append(
            {
                "split": r["split"],
                "shard": r["shard"],
                "samples": r.get("samples", 0),
                "tokens": r.get("tokens", 0),
                "truncated": r.get("truncated", 0),
                "bytes_stored": r.get("bytes_stored", 0),
                "bytes_per_token": r.get("bytes_per_token"),
                "compression_ratio": r.get("compression_ratio"),
                "greedy_match": r.get("greedy_match"),
                "min_cosine": r.get("min_cosine"),
                "errors": r.get("errors", 0),
                **{f"err:{k}": v for k, v in r.get("error_counts", {}).items()},
            }
        )
    df = pd.DataFrame(rows)
    err_cols = sorted(c for c in df.columns if c.startswith("err:"))
    df[err_cols] = df[err_cols].fillna(0).astype(int)
    base = [c for c in df.columns if not c.startswith("err:")]
    df = df[base + err_cols]
    total = {"split": "all", "shard": "all"}
    for c in ("samples", "tokens", "truncated", "bytes_stored", "errors", *err_cols):
        total[c] = int(df[c].sum())
    total["bytes_per_token"] = total["bytes_stored"] / total["tokens"] if total["tokens"] else None
    ratios = df["compression_ratio"].dropna()
    total["compression_ratio"] = float(ratios.mean()) if len(ratios) else None
    greedy = df["greedy_match"].dropna()
    total["greedy_match"] = float(greedy.min()) if len(greedy) else None
    cos = df["min_cosine"].dropna()
    total["min_cosine"] = float(cos.min()) if len(cos) else None
    return pd.concat([df, pd.DataFrame([total])], ignore_index=True)


def markdown(df: pd.DataFrame) -> str:
    """A Markdown table without optional dependencies (pandas' to_markdown needs tabulate)."""

    digits = {"min_cosine": 6, "greedy_match": 4, "compression_ratio": 3, "bytes_per_token": 1}

    def cell(col, v):
        if v is None or (isinstance(v, float) and np.isnan(v)):
            return "-"
        if isinstance(v, float):
            return f"{v:.{digits.get(col, 4)}f}"
        return str(v)

    cols = list(df.columns)
    head = "| " + " | ".join(cols) + " |"
    rule = "|" + "|".join("---" for _ in cols) + "|"
    body = [
        "| " + " | ".join(cell(c, v) for c, v in zip(cols, row, strict=True)) + " |"
        for row in df.itertuples(index=False)
    ]
    return "\n".join([head, rule, *body]) + "\n"


def summarize(report_paths: list, csv_path, md_path, max_errors: int) -> tuple[bool, str]:
    """Write the summary table; (ok, message) where ok is False past validate.max_errors."""
    reports = [json.loads(Path(p).read_text()) for p in report_paths]
    cross_shard(reports)
    df = summary_table(reports)
    total = int(df.iloc[-1]["errors"])
    kinds = {c[4:]: int(df.iloc[-1][c]) for c in df.columns if c.startswith("err:")}
    md = "# Hidden-state validation\n\n" + markdown(df)
    md += "\n`truncated`: samples stored cut at dataset.max_tokens (counted, not errors).\n"
    if kinds:
        md += "\nError kinds:\n\n" + "".join(
            f"- `{k}` ({n}): {KINDS.get(k, 'listed by the extraction: ' + k.split(':', 1)[-1])}\n"
            for k, n in kinds.items()
        )
    for path, text in ((csv_path, df.to_csv(index=False)), (md_path, md)):
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    ok = total <= max_errors
    msg = (
        f"validation: {total} errors over {len(reports)} shards "
        f"({', '.join(f'{k}={n}' for k, n in kinds.items()) or 'none'}); "
        f"validate.max_errors is {max_errors}"
    )
    if not ok:
        from eyrie.validate.advice import shard_advice

        advice = [shard_advice(r) for r in reports if r.get("errors")]
        msg += (
            ". The per-shard reports list each problem with its sample id. What fixes it:\n"
            + "".join(f"- {a}\n" for a in advice if a)
        )
    return ok, msg + "\n\n" + md
