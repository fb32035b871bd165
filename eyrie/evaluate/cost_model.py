"""What speculation buys where it cannot be run: measured cycle costs, carried-over accept lengths.

One EAGLE-3 cycle at batch 1 runs `steps` draft passes, then one target pass over its
draft tokens, and emits the accepted drafts plus one token of the target's own. Its wall time
does not depend on how many drafts the target accepts (the same passes run either way), so it
can be timed with any drafter, a random one on a random-weight target of the real shape
included. A drafter whose accept length is L (tokens per verify pass, bonus included) then
decodes at

    speedup = L * t_plain / t_cycle

times the plain server's speed, t_plain being one plain decode step of the same setup. For
chains, t_cycle(k) = a + b k fits the measured cycles: `a` is the verify pass and the cycle's
fixed overhead, `b` one more draft pass and one more verified token. Every figure this gives
for a target that was not served with a trained drafter is a projection and is labelled so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ChainFit:
    """t_cycle(k) = fixed_ms + per_draft_ms * k, fitted to chains of k drafts."""

    fixed_ms: float
    per_draft_ms: float
    points: int

    def cycle_ms(self, k: int) -> float:
        return self.fixed_ms + self.per_draft_ms * k


def fit_chain(draft_steps: Sequence[int], cycle_ms: Sequence[float]) -> ChainFit:
    """Least-squares line through (k, cycle ms); needs two distinct k."""
    if len(draft_steps) != len(cycle_ms) or len(set(draft_steps)) < 2:
        raise ValueError(
            "a chain fit needs cycles at two or more distinct draft counts, got "
            f"{list(draft_steps)}"
        )
    n = len(draft_steps)
    mk, mc = sum(draft_steps) / n, sum(cycle_ms) / n
    skk = sum((k - mk) ** 2 for k in draft_steps)
    skc = sum((k - mk) * (c - mc) for k, c in zip(draft_steps, cycle_ms, strict=True))
    slope = skc / skk
    return ChainFit(fixed_ms=mc - slope * mk, per_draft_ms=slope, points=n)


def speedup(accept_length: float, plain_step_ms: float, cycle_ms: float) -> float:
    """Speculative over plain decoding speed for a drafter of this accept length."""
    if accept_length < 1 or plain_step_ms <= 0 or cycle_ms <= 0:
        raise ValueError(
            f"accept length must be >= 1 and times positive (got L={accept_length}, "
            f"plain {plain_step_ms} ms, cycle {cycle_ms} ms)"
        )
    return accept_length * plain_step_ms / cycle_ms


def break_even(plain_step_ms: float, cycle_ms: float) -> float:
    """The accept length at which speculation neither gains nor loses."""
    return cycle_ms / plain_step_ms


def check_published(
    accept_length: float, published_speedup: float, plain_step_ms: float, cycle_ms: float
) -> dict:
    """The model's speed-up for a published accept length, next to the published speed-up."""
    predicted = speedup(accept_length, plain_step_ms, cycle_ms)
    return {
        "accept_length": accept_length,
        "published_speedup": published_speedup,
        "predicted_speedup": predicted,
        "relative_error": predicted / published_speedup - 1.0,
    }
