"""Greedy speculative decoding with a tree of drafts (EAGLE-2's dynamic tree, as SGLang runs it).

A chain bets every verify pass on one guess per position. On a small target the verify pass
costs about as much for 8 tokens as for 4 (benchmarks/RESULTS.md, "Trees on the CPU"), so the
pass can carry several guesses per position at almost no extra cost. Drafting, with ``steps``
S, ``topk`` K and ``verify_tokens`` N (SGLang's ``--speculative-num-steps``, ``-eagle-topk``,
``-num-draft-tokens``):

- step 0: the K most likely first tokens of the drafter's distribution at the last verified row;
- step s = 1 .. S-1: the K frontier nodes each run one drafter row (attending to the verified
  rows and to their own ancestors' rows only), and of their K x K children, scored by the sum of
  log-probabilities along the path, the best K become the next frontier;
- every node scored on the way is a candidate; the N - 1 best form the tree (a node scores below
  its parent, so the best ones include their ancestors).

The target then reads the last accepted token (the root) and the tree in one pass: each node
sits at position root + depth and attends to the cache and to its ancestors (a 4-D mask). From
the root, the child whose token equals the target's greedy choice is accepted, again and again;
the target's choice after the last accepted node is the bonus token. The accepted path's
entries are kept in the target's cache, the rest dropped, so the output is plain greedy
decoding's, token for token; only the number of target passes changes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from eyrie.evaluate.draft_runner import DraftRunner
from eyrie.evaluate.speculate import Generation, cut_output, start_speculation, sync_device
from eyrie.evaluate.target_runner import SpeculateError, Target, cache_length, crop_cache


@dataclass
class Tree:
    """Drafted nodes in verify order (parents before children); parent -1 is the root."""

    tokens: list[int]  # target token ids
    parents: list[int]
    depths: list[int]  # 1 for the root's children

    def ancestors(self) -> torch.Tensor:
        """(1 + n, 1 + n) bool: row i is True at i, its ancestors and the root (index 0)."""
        n = len(self.tokens)
        anc = torch.zeros(n + 1, n + 1, dtype=torch.bool)
        anc[:, 0] = True
        for i in range(n):
            anc[i + 1, i + 1] = True
            p = self.parents[i]
            if p >= 0:
                anc[i + 1] |= anc[p + 1]
        return anc


def tree_shape(steps: int, topk: int, verify_tokens: int | None) -> int:
    """The tokens one verify pass reads (the root included), checked: ``steps`` + 1 for a chain
    (``topk`` 1, ``verify_tokens`` null or that), ``verify_tokens`` for a tree."""
    if topk == 1 and verify_tokens in (None, steps + 1):
        if steps < 1:
            raise SpeculateError(f"evaluate.draft_tokens must be at least 1, got {steps}")
        return steps + 1
    if topk == 1:
        raise SpeculateError(
            f"evaluate.verify_tokens {verify_tokens}: a chain of {steps} drafts (topk 1) "
            f"verifies {steps + 1} tokens; set it to null, or topk above 1 for a tree"
        )
    if verify_tokens is None:
        raise SpeculateError(
            f"evaluate.topk {topk} drafts a tree, which needs evaluate.verify_tokens (the "
            "tokens one verify pass reads, the root included; e.g. 8)"
        )
    check_tree_shape(steps, topk, verify_tokens)
    return verify_tokens


def check_tree_shape(steps: int, topk: int, verify_tokens: int) -> None:
    """The (steps, topk, verify_tokens) SGLang accepts, with the key to change named."""
    if steps < 1 or topk < 1:
        raise SpeculateError(
            f"a draft tree needs evaluate.draft_tokens >= 1 and evaluate.topk >= 1, got "
            f"{steps} and {topk}"
        )
    most = 1 + topk + (steps - 1) * topk * topk  # the root and every node scored
    if not 2 <= verify_tokens <= most:
        raise SpeculateError(
            f"evaluate.verify_tokens {verify_tokens}: a tree of {steps} steps and topk {topk} "
            f"verifies between 2 and {most} tokens (the root included)"
        )


@torch.inference_mode()
def propose_tree(drafter: DraftRunner, steps: int, topk: int, verify_tokens: int) -> Tree:
    """The best ``verify_tokens - 1`` drafted nodes continuing the verified tokens.

    Batch-1 drafting is a string of tiny operations, so the bookkeeping (K x K candidates a
    step) is done on Python lists, and torch only runs the drafter's rows and logits."""
    d, verified = drafter.d, drafter.length
    to_target = drafter.target_ids()
    topk = min(topk, d.d2t.numel())
    score, draft = torch.log_softmax(d.logits(drafter.last)[0, -1].float(), -1).topk(topk)
    # the candidate pool: target token, parent (pool index, -1 the root), depth, score
    tokens = [to_target[i] for i in draft.tolist()]
    scores = score.tolist()
    parents, depths = [-1] * len(tokens), [1] * len(tokens)
    frontier = list(range(len(tokens)))
    slot: dict[int, int] = {}  # pool index -> the drafter cache row it ran in
    hidden = drafter.last.expand(1, len(frontier), -1)
    for step in range(1, steps):
        base, rows = drafter.length, len(frontier)
        mask = torch.zeros(rows, base + rows, dtype=torch.bool)
        mask[:, :verified] = True
        at_r, at_c = [], []
        for r, node in enumerate(frontier):
            slot[node] = base + r
            p = node
            while p >= 0:
                at_r.append(r)
                at_c.append(slot[p])
                p = parents[p]
        mask[at_r, at_c] = True
        ids = torch.tensor([[tokens[n] for n in frontier]], dtype=torch.long)
        positions = torch.full((rows,), verified + step - 1, dtype=torch.long)
        dev = hidden.device
        out = drafter.rows(hidden, ids.to(dev), positions.to(dev), mask.to(dev))  # (1, rows, H)
        child_score, child_draft = torch.log_softmax(d.logits(out)[0].float(), -1).topk(topk)
        first = len(tokens)
        for r, (cs, cd) in enumerate(zip(child_score.tolist(), child_draft.tolist(), strict=True)):
            s0 = scores[frontier[r]]
            scores += [s0 + x for x in cs]
            tokens += [to_target[i] for i in cd]
            parents += [frontier[r]] * len(cd)
            depths += [step + 1] * len(cd)
        best = sorted(range(first, len(tokens)), key=lambda i: -scores[i])[:topk]
        hidden = out[:, [(i - first) // topk for i in best]]
        frontier = best
    drafter.crop(verified)
    # the best nodes; ties go to the shallower (so a parent is never left out for its child)
    chosen = sorted(range(len(tokens)), key=lambda i: (-scores[i], depths[i], i))
    keep = _preorder(parents, scores, set(chosen[: verify_tokens - 1]))
    where = {node: j for j, node in enumerate(keep)}
    return Tree(
        tokens=[tokens[i] for i in keep],
        parents=[where[parents[i]] if parents[i] >= 0 else -1 for i in keep],
        depths=[depths[i] for i in keep],
    )


def _preorder(parents: list[int], scores: list[float], chosen: set[int]) -> list[int]:
    """The chosen nodes whose ancestors are all chosen, depth first, best child first.

    Parents come before children (what the verify pass needs), and the drafter's own best chain
    comes first: when the target accepts along it, the accepted rows are 0..a and the target's
    cache is only cropped."""
    children: dict[int, list[int]] = {}
    for i in chosen:
        children.setdefault(parents[i], []).append(i)
    order, stack = [], sorted(children.get(-1, []), key=lambda i: scores[i])
    while stack:
        node = stack.pop()
        order.append(node)
        stack += sorted(children.get(node, []), key=lambda i: scores[i])
    return order


def accept_path(tree: Tree, choice: list[int]) -> list[int]:
    """Tree indices of the accepted nodes, root outward; choice[j] is the target's greedy token
    after input j (0 the root, j + 1 node j)."""
    path, at = [], -1
    while True:
        want = choice[at + 1]
        nxt = next(
            (j for j, p in enumerate(tree.parents) if p == at and tree.tokens[j] == want), None
        )
        if nxt is None:
            return path
        path.append(nxt)
        at = nxt


@torch.inference_mode()
def keep_cache_rows(cache, start: int, rows: list[int]) -> None:
    """Keep positions [0, start) and start + rows (ascending, rows[0] == 0) of every layer.

    The kept rows move down in place, then the cache is cropped: no layer is reallocated."""
    moved = [(start + j, start + r) for j, r in enumerate(rows) if r != j]
    if moved:
        dst = torch.tensor([d for d, _ in moved])
        src = torch.tensor([s for _, s in moved])
        for layer in cache.layers:
            for t in (layer.keys, layer.values):
                t[:, :, dst.to(t.device)] = t[:, :, src.to(t.device)]
    crop_cache(cache, start + len(rows))


def tree_generate(
    target: Target,
    drafter: DraftRunner,
    prompt: list[int],
    steps: int,
    topk: int,
    verify_tokens: int,
    max_new_tokens: int,
    eos=(),
) -> Generation:
    """Greedy tree speculative decoding; the output equals greedy's."""
    check_tree_shape(steps, topk, verify_tokens)
    t0, cache, out, eos, done = start_speculation(target, drafter, prompt, max_new_tokens, eos)
    accepted: list[int] = []
    while not done:
        n = cache_length(cache)  # out[-1], the root, sits at position n
        tree = propose_tree(drafter, steps, topk, verify_tokens)
        mask = torch.cat(
            [torch.ones(len(tree.tokens) + 1, n, dtype=torch.bool), tree.ancestors()], 1
        )
        positions = [n] + [n + dep for dep in tree.depths]
        logits, aux = target.forward(
            [out[-1]] + tree.tokens, cache, attention_mask=mask, positions=positions
        )
        choice = logits.argmax(-1).tolist()
        path = accept_path(tree, choice)
        rows = [0] + [j + 1 for j in path]
        new = [tree.tokens[j] for j in path] + [choice[rows[-1]]]
        keep_cache_rows(cache, n, rows)
        drafter.extend(aux[:, rows], new, n)
        accepted.append(len(path))
        out, done = cut_output(out + new, max_new_tokens, eos)
    sync_device(target.device)
    return Generation(out, time.perf_counter() - t0, accepted)
