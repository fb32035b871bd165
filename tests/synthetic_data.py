"""Synthetic hidden-state-like activations for the store tests and the benchmarks.

Not part of the package: tests import it from tests/ (pytest puts that folder on the path),
benchmarks put tests/ on sys.path first (see benchmarks/common.py).
"""

from __future__ import annotations

import numpy as np
import torch


def synthetic_activations(
    rng: np.random.Generator, tokens: int, k: int, hidden: int, *, model_seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Hidden-state-like bf16 data: (aux (tokens, k, hidden), final (tokens, hidden)).

    Modelled on real residual streams, whose statistics decide how well they compress: per-channel
    scales (lognormal, growing with depth), heavy-tailed values (Student-t, 5 dof), a few outlier
    channels ~30x larger, and massive activations on the first token. Channel statistics come
    from ``model_seed`` (fixed per "model"); token values from ``rng``.
    """
    mr = np.random.default_rng(model_seed)
    scale = mr.lognormal(0.0, 0.5, size=(k + 1, hidden)).astype(np.float32)
    scale[:k] *= np.linspace(0.5, 2.0, k, dtype=np.float32)[:, None]
    outliers = mr.choice(hidden, size=max(2, hidden // 500), replace=False)
    scale[:, outliers] *= 30.0
    x = rng.standard_t(5, size=(tokens, k + 1, hidden)).astype(np.float32)
    x *= scale
    if tokens:
        x[0, :k, outliers[:2]] = 1000.0 * np.sign(x[0, :k, outliers[:2]])
    b = torch.from_numpy(x).to(torch.bfloat16)
    return b[:, :k].contiguous(), b[:, k].contiguous()
