"""Tree speculative decoding equals greedy decoding; the tree's verify pass equals each path
decoded alone; the accepted path's cache equals a fresh pass; a top-1 tree is the chain."""

from __future__ import annotations

import pytest
import test_speculate
import torch
from test_speculate import PROMPTS, reference_greedy

from eyrie.evaluate import tree as tr
from eyrie.evaluate.speculate import greedy_generate
from eyrie.evaluate.target_runner import SpeculateError
from eyrie.evaluate.tree import Tree, accept_path, propose_tree, tree_generate, tree_shape

# the chain's fixtures: one torch thread, a tiny Llama target with an untrained drafter
one_thread, tiny = test_speculate.one_thread, test_speculate.tiny


@pytest.mark.parametrize("shape", [(1, 2, 3), (2, 2, 4), (3, 4, 8), (4, 3, 10)])
def test_tree_output_is_greedy(tiny, shape):
    target, runner, _ = tiny
    for p in PROMPTS:
        got = tree_generate(target, runner, p, *shape, 16)
        assert got.tokens == reference_greedy(target.model, p, 16)
        assert max(got.accepted) <= shape[0]


def _tree_of(paths: list[list[int]]) -> Tree:
    """A Tree holding every prefix of the given token paths, in depth-first order."""
    tokens, parents, depths, index = [], [], [], {}
    for path in paths:
        for d in range(1, len(path) + 1):
            key = tuple(path[:d])
            if key not in index:
                index[key] = len(tokens)
                tokens.append(path[d - 1])
                parents.append(index[key[:-1]] if d > 1 else -1)
                depths.append(d)
    return Tree(tokens, parents, depths)


def test_verify_pass_equals_each_path_decoded_alone(tiny):
    target, _, _ = tiny
    prompt = PROMPTS[2]
    tree = _tree_of([[5, 6, 7], [5, 9], [11, 12, 13], [14]])
    cache = target.new_cache()
    target.forward(prompt, cache)
    n = len(prompt)
    mask = torch.cat([torch.ones(len(tree.tokens) + 1, n, dtype=torch.bool), tree.ancestors()], 1)
    positions = [n] + [n + d for d in tree.depths]
    root = 77
    logits, _ = target.forward(
        [root, *tree.tokens], cache, attention_mask=mask, positions=positions
    )
    for j in range(-1, len(tree.tokens)):
        path, at = [], j
        while at >= 0:
            path.insert(0, tree.tokens[at])
            at = tree.parents[at]
        with torch.no_grad():  # a cacheless forward over the whole sequence: the reference
            ref = target.model(input_ids=torch.tensor([prompt + [root] + path])).logits[0, -1]
        assert torch.allclose(logits[j + 1], ref, atol=1e-4), j


def test_accept_path_follows_the_targets_choices():
    tree = _tree_of([[5, 6, 7], [5, 9], [11, 12]])  # nodes: 5 6 7 9 11 12
    assert tree.tokens == [5, 6, 7, 9, 11, 12]
    # choice[j]: the target's token after input j (0 the root, j + 1 node j)
    assert accept_path(tree, [5, 9, 0, 0, 0, 0, 0]) == [0, 3]
    assert accept_path(tree, [5, 6, 7, 0, 0, 0, 0]) == [0, 1, 2]
    assert accept_path(tree, [11, 0, 0, 0, 0, 12, 0]) == [4, 5]
    assert accept_path(tree, [3, 5, 5, 5, 5, 5, 5]) == []


class ForcedTree:
    """propose_tree replaced: the true continuation sits on the tree's second branch at every
    depth (so accepted rows are never the first ones), cut after ``cut(step)`` right nodes."""

    def __init__(self, sequence, cut):
        self.sequence, self.cut, self.steps, self.real = sequence, cut, 0, propose_tree

    def __call__(self, drafter, steps, topk, verify_tokens):
        self.real(drafter, steps, topk, verify_tokens)  # runs the drafter as usual
        at = drafter.length
        true = list(self.sequence[at + 1 : at + 1 + steps])
        right = self.cut(self.steps)
        self.steps += 1
        wrong = [[(t + 1) % 50 + 3] for t in true]
        good = true[:right] + [(true[right] + 2) % 50 + 3] if right < steps else true
        # first a wrong first token, then the path of the right ones, a wrong sibling each
        paths = [wrong[0], good] + [true[:d] + wrong[d] for d in range(1, min(right, steps))]
        return _tree_of(paths)


@pytest.mark.parametrize("steps", [2, 3])
def test_forced_tree_accepts_known_paths_and_caches_right(tiny, monkeypatch, steps):
    target, runner, _ = tiny
    prompt = PROMPTS[2]
    n_new = 30
    plain = greedy_generate(target, prompt, n_new)
    sequence = prompt + plain.tokens + [0] * 8
    forced = ForcedTree(sequence, cut=lambda step: step % (steps + 1))
    monkeypatch.setattr(tr, "propose_tree", forced)
    seen = {}
    real_keep = tr.keep_cache_rows

    def keep(cache, start, rows):
        seen.setdefault("rows", []).append(rows)
        real_keep(cache, start, rows)
        seen["cache"] = cache

    monkeypatch.setattr(tr, "keep_cache_rows", keep)
    got = tree_generate(target, runner, prompt, steps, 2, 2 * steps + 2, n_new)
    assert got.tokens == plain.tokens
    want = [s % (steps + 1) for s in range(len(got.accepted))]
    assert got.accepted[:-1] == want[:-1]
    assert any(r != list(range(len(r))) for r in seen["rows"])  # rows moved, not only cropped

    # the target's cache after the run equals a fresh pass over the same tokens
    cache = seen["cache"]
    full = prompt + got.tokens  # max_new_tokens may have cut the last step's tokens
    length = min(cache.get_seq_length(), len(full))
    assert length > len(prompt) + n_new // 2
    fresh = target.new_cache()
    target.forward(full[:length], fresh)
    for a, b in zip(cache.layers, fresh.layers, strict=True):
        assert torch.allclose(a.keys[:, :, :length], b.keys, atol=1e-5)
        assert torch.allclose(a.values[:, :, :length], b.values, atol=1e-5)


def test_a_top1_tree_is_the_chain(tiny):
    target, runner, _ = tiny
    prompt = PROMPTS[0]
    cache = target.new_cache()
    logits, aux = target.forward(prompt, cache)
    runner.reset()
    runner.extend(aux, prompt[1:] + [int(logits[-1].argmax())], 0)
    for k in (1, 3, 5):
        tree = propose_tree(runner, k, 1, k + 1)
        assert tree.tokens == runner.propose(k)  # the chain's own code: the reference
        assert tree.parents == list(range(-1, k - 1)) and tree.depths == list(range(1, k + 1))
        assert runner.length == len(prompt)  # the tree's rows were dropped


def test_a_tree_keeps_its_best_nodes_with_their_ancestors(tiny):
    target, runner, _ = tiny
    prompt = PROMPTS[1]
    _, aux = target.forward(prompt, target.new_cache())
    runner.reset()
    runner.extend(aux, prompt[1:] + [5], 0)
    tree = propose_tree(runner, 3, 4, 10)
    assert len(tree.tokens) == 9
    for j, (p, d) in enumerate(zip(tree.parents, tree.depths, strict=True)):
        assert p < j and d == (1 if p < 0 else tree.depths[p] + 1)
    siblings = {}
    for j, p in enumerate(tree.parents):
        siblings.setdefault(p, []).append(tree.tokens[j])
    assert all(len(set(s)) == len(s) for s in siblings.values())  # no token twice per parent


def test_tree_shapes_are_checked_with_the_key_named():
    assert tree_shape(3, 1, None) == 4 and tree_shape(3, 1, 4) == 4
    assert tree_shape(3, 4, 8) == 8
    with pytest.raises(SpeculateError, match="verify_tokens 8: a chain of 3 drafts"):
        tree_shape(3, 1, 8)
    with pytest.raises(SpeculateError, match="needs evaluate.verify_tokens"):
        tree_shape(3, 4, None)
    with pytest.raises(SpeculateError, match="between 2 and 7"):
        tree_shape(2, 2, 8)  # the root, 2 first nodes and 2 x 2 children at most
    with pytest.raises(SpeculateError, match="at least 1"):
        tree_shape(0, 1, None)
