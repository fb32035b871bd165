"""Held-out accuracy of the drafter: loss, acc_k and chain accuracy per unroll step.

Every sample of the held-out stores is scored once (batches sorted by length, split over the
processes); the sums are all-reduced, so any number of processes report the same numbers.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from eyrie.train.checkpoint import unwrap
from eyrie.train.data import Pad, sample_lengths, to_device
from eyrie.train.distributed import Dist
from eyrie.train.method import heldout_terms, positions


@torch.no_grad()
def evaluate(model, head, dataset, settings: dict, device, dtype, d: Dist) -> dict:
    """Held-out loss, acc_k and chain accuracy per unroll step over every sample of ``dataset``.

    chain_acc_k is the fraction of chain starts (rows whose step-0 draft is scored) whose
    drafts of steps 0..k are all right: the chance that k+1 drafted tokens are accepted.
    """
    model.eval()
    steps = positions(settings)
    lengths = sample_lengths(dataset.paths, settings["max_len"])
    mine = sorted(range(d.rank, len(dataset), d.world), key=lambda i: lengths[i])
    bs = max(1, settings["batch_size"] // d.world)
    loader = DataLoader(
        dataset,
        batch_sampler=[mine[i : i + bs] for i in range(0, len(mine), bs)],
        collate_fn=Pad(settings["max_len"]),
        num_workers=settings["num_workers"],
    )
    inner = unwrap(model)
    sums = torch.zeros(4 * steps + 2, dtype=torch.float64)
    for batch in loader:
        batch = to_device(batch, device, dtype)
        t = heldout_terms(inner, head, batch, settings, dtype)
        parts = [t["ce"].double(), t["correct"], t["chain"], t["counts"], t["chain_starts"].view(1)]
        parts.append(torch.tensor([len(batch["input_ids"])], dtype=torch.float64))
        sums += torch.cat([x.cpu() for x in parts])
    sums = d.sum(sums.to(device)).cpu()
    model.train()
    ce, correct, chain, counts = (
        sums[:steps],
        sums[steps : 2 * steps],
        sums[2 * steps : 3 * steps],
        sums[3 * steps : 4 * steps],
    )
    starts, samples = float(sums[4 * steps]), int(sums[4 * steps + 1])
    safe = counts.clamp(min=1)
    chain_acc = (chain / max(starts, 1.0)).tolist()
    return {
        "samples": samples,
        "scored": [int(c) for c in counts],
        "loss": (ce / safe).tolist(),
        "acc": (correct / safe).tolist(),
        "chain_acc": chain_acc,
        "step0_acc": float(correct[0] / safe[0]),
        "accept_length_estimate": 1.0 + sum(chain_acc),
    }
