"""What the loop is fed: the global batches of each step, padded, and the stores' agreement.

GlobalBatches decides which samples form optimizer step k's batch from (seed, k) alone, so a
resumed run and any number of processes see the same batches; Pad collates a batch into
right-padded tensors (the evaluate stage pads with it too). store_identity and check_stores
refuse stores that disagree with each other or with the target before any step is taken.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from eyrie.common.hf_config import text_config
from eyrie.train.distributed import Dist
from eyrie.train.settings import TrainError


class GlobalBatches:
    """This process's share of each global batch, from optimizer step ``start`` to ``stop``.

    Epoch e is a permutation seeded by (seed, e), cut into groups of ``bucket`` batches; each
    group is sorted by length, cut into batches (little padding), and its batches are visited
    in a seeded random order. Everything follows from (seed, step), so a resumed run and any
    number of processes see the same global batches; process r of W takes every W-th sample.
    """

    def __init__(
        self, lengths, batch_size: int, seed: int, start: int, stop: int, d: Dist, bucket: int = 32
    ):
        if len(lengths) == 0:
            raise TrainError("the train stores hold no samples; check the extract stage")
        if batch_size < d.world:
            raise TrainError(
                f"train.batch_size {batch_size} is smaller than the {d.world} processes; "
                "raise it so each process gets a sample"
            )
        self.lengths = torch.as_tensor(lengths, dtype=torch.int64)
        self.bs, self.seed, self.bucket, self.d = batch_size, seed, bucket, d
        self.start, self.stop = start, stop

    @staticmethod
    def steps_per_epoch(n: int, batch_size: int) -> int:
        return max(1, n // batch_size)

    def global_batch(self, step: int) -> list[int]:
        n, bs = len(self.lengths), self.bs
        steps_per_epoch = self.steps_per_epoch(n, bs)
        epoch, i = divmod(step, steps_per_epoch)
        perm = torch.randperm(n, generator=seeded(self.seed, epoch))[: steps_per_epoch * bs]
        group, within = divmod(i, self.bucket)
        chunk = perm[group * self.bucket * bs : (group + 1) * self.bucket * bs]
        chunk = chunk[torch.argsort(self.lengths[chunk], stable=True)]
        batches = list(chunk.split(bs))
        order = torch.randperm(len(batches), generator=seeded(self.seed, epoch, group))
        return batches[int(order[within])].tolist()

    def __iter__(self):
        for step in range(self.start, self.stop):
            yield self.global_batch(step)[self.d.rank :: self.d.world]

    def __len__(self) -> int:
        return max(0, self.stop - self.start)


def seeded(*keys: int) -> torch.Generator:
    """A generator seeded by a tuple of ints (no two tuples share a stream in practice)."""
    digest = hashlib.sha256(repr(tuple(int(k) for k in keys)).encode()).hexdigest()
    return torch.Generator().manual_seed(int(digest[:15], 16))


def sample_lengths(paths, max_len: int) -> list[int]:
    from eyrie.store.shard import ShardReader

    out: list[int] = []
    for p in paths:
        offsets = ShardReader(p).offsets
        out += [min(int(b - a), max_len) for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
    return out


class Pad:
    """Collate samples into right-padded tensors, each cut to ``max_len`` tokens."""

    def __init__(self, max_len: int):
        self.max_len = max_len

    def __call__(self, samples: list[dict]) -> dict:
        n = [min(len(s["input_ids"]), self.max_len) for s in samples]
        B, T = len(samples), max(n)
        k, H = samples[0]["aux_hidden"].shape[1:]
        out = {
            "lengths": torch.tensor(n, dtype=torch.long),
            "input_ids": torch.zeros(B, T, dtype=torch.long),
            "loss_mask": torch.zeros(B, T, dtype=torch.bool),
            "aux_hidden": torch.zeros(B, T, k, H, dtype=torch.bfloat16),
            "final_hidden": torch.zeros(B, T, H, dtype=torch.bfloat16),
        }
        for b, (s, L) in enumerate(zip(samples, n, strict=True)):
            for name in ("input_ids", "loss_mask", "aux_hidden", "final_hidden"):
                out[name][b, :L] = s[name][:L]
        return out


def store_identity(paths) -> list[dict]:
    """What a store holds, cheaply: its commit record and its aux layer ids."""
    from eyrie.store.shard import ShardReader

    out = []
    for p in paths:
        r = ShardReader(p)
        commit = json.loads((Path(p) / "commit.json").read_text())
        out.append(
            {
                "path": str(p),
                "samples": len(r),
                "tokens": r.num_tokens,
                "sample_ids_sha256": commit.get("sample_ids_sha256"),
                "aux_layer_ids": r.aux_layer_ids,
                "hidden_size": r.hidden_size,
                "weights_sha256": r.attrs.get("provenance", {}).get("weights_sha256"),
            }
        )
    return out


def check_stores(identity: list[dict], target_cfg: dict, what: str) -> list[int]:
    """The stores' common aux layer ids, once every store agrees with the others and the target."""
    text = text_config(target_cfg)
    first = identity[0]
    for s in identity:
        if s["aux_layer_ids"] != first["aux_layer_ids"]:
            raise TrainError(
                f"{what} stores disagree on aux layer ids: {first['path']} has "
                f"{first['aux_layer_ids']}, {s['path']} has {s['aux_layer_ids']}; re-extract them "
                "with one capture.aux_layer_ids"
            )
        if s["hidden_size"] != int(text["hidden_size"]):
            raise TrainError(
                f"{s['path']} has hidden size {s['hidden_size']} but the target's is "
                f"{text['hidden_size']}: the store comes from another model; re-extract it"
            )
        if s["weights_sha256"] != first["weights_sha256"]:
            raise TrainError(
                f"{what} stores were extracted from different target weights ({first['path']} vs "
                f"{s['path']}); re-extract them from one target"
            )
    return list(first["aux_layer_ids"])


def to_device(batch: dict, device, dtype) -> dict:
    out = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    if dtype is None:  # fp32 compute: the bf16 activations are upcast once here
        out["aux_hidden"] = out["aux_hidden"].float()
        out["final_hidden"] = out["final_hidden"].float()
    return out
