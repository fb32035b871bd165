"""Where a speculative output parts from plain greedy: the token, the target's top-two logit
gap there (a bf16 tie or a fault), the served comparison's list, and the report's lines about
them and about a drafter that fits its training data far better than held-out."""

from __future__ import annotations

import pandas as pd

from eyrie.evaluate.compare import first_difference, rows_of, summarize
from eyrie.evaluate.online import differences
from eyrie.evaluate.speculate import Generation
from eyrie.evaluate.summary import difference_text, overfit_lines, parted_text


def test_first_difference_names_the_token_and_the_margin_there():
    plain = Generation([5, 6, 7, 8], 1.0, margins=[3.0, 2.5, 0.01, 4.0])
    same = Generation([5, 6, 7, 8], 1.0, [1, 1])
    parted = Generation([5, 6, 9, 8], 1.0, [1, 1])
    assert first_difference([(plain, same)]) is None
    diff = first_difference([(plain, same), (plain, parted)])
    assert diff == {"repeat": 1, "index": 2, "plain": 7, "spec": 9, "margin": 0.01}
    short = first_difference([(plain, Generation([5, 6], 1.0))])
    assert short == {"repeat": 0, "index": 2, "plain": 7, "spec": None, "margin": 0.01}
    rows = rows_of([{"id": "a", "input_ids": [1, 2]}], [[(plain, parted)]])
    assert summarize(rows, k=3)["difference_margins"] == [0.01]


def test_the_summary_says_how_near_a_tie_each_difference_was():
    assert difference_text({"difference_margins": []}) == ""
    assert difference_text({"difference_margins": [None]}) == ""
    text = difference_text({"difference_margins": [0.5, 0.0625, None], "dtype": "bfloat16"})
    assert "0.0625, 0.5 apart" in text and "bfloat16" in text


def test_served_outputs_that_part_are_listed_with_the_token_index():
    plain = [{"id": "a", "output_ids": [1, 2, 3], "seconds": 1.0},
             {"id": "b", "output_ids": [4, 5, 6], "seconds": 1.0}]  # fmt: skip
    spec = [{"id": "a", "output_ids": [1, 2, 3], "seconds": 0.5},
            {"id": "b", "output_ids": [4, 9, 6], "seconds": 0.5}]  # fmt: skip
    assert differences(plain, spec) == [{"id": "b", "index": 1, "plain": 5, "spec": 9}]
    assert parted_text([]) == ""
    many = [{"id": str(i), "index": i, "plain": 1, "spec": 2} for i in range(6)]
    assert (
        parted_text(many) == "; outputs part: 0 at token 0, 1 at token 1, 2 at token 2, "
        "3 at token 3 and 2 more"
    )


def test_the_summary_warns_when_training_acc_runs_far_above_held_out():
    df = pd.DataFrame({"step": range(1, 21), "acc_0": [0.1] * 18 + [0.64, 0.68]})
    assert overfit_lines(df, None) == []
    assert overfit_lines(df, [0.55]) == []  # 0.66 over the last tenth, 11 points above
    (line,) = overfit_lines(df, [0.315])
    assert "acc_0 66 %" in line and "against 32 % held-out" in line
    assert "dataset.max_samples" in line
