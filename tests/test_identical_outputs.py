"""benchmarks/identical_outputs.py on toy-llama: a speculative output perturbed at a known
position is reported there, with the target's top-1/top-2 gap computed independently."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "models" / "toy-llama"
HELDOUT = ROOT / "data" / "chat" / "heldout.jsonl"
NEW, AT = 10, 4  # new tokens per prompt; the position where the second output is changed

_spec = importlib.util.spec_from_file_location("io_", ROOT / "benchmarks" / "identical_outputs.py")
io_ = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(io_)

pytestmark = pytest.mark.skipif(not (TOY / "model.safetensors").is_file(), reason="no toy-llama")


@pytest.fixture(scope="module")
def world():
    from transformers import AutoModelForCausalLM

    from eyrie.evaluate.loading import load_prompts
    from eyrie.target.load import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(TOY, dtype=torch.float32).eval()
    prompts = load_prompts(HELDOUT, load_tokenizer(TOY), 2)
    plain, full_logits = [], []
    with torch.no_grad():
        for p in prompts:  # greedy, one token at a time over the whole sequence
            seq = list(p["input_ids"])
            for _ in range(NEW):
                seq.append(int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
            plain.append({"id": p["id"], "output_ids": seq[len(p["input_ids"]) :]})
            # one forward over prompt + output: row len(prompt) + i - 1 predicts new token i
            full_logits.append(model(input_ids=torch.tensor([seq])).logits[0].float())
    # the EAGLE-3 output of prompt 0 takes the runner-up at position AT, then goes elsewhere
    n0 = len(prompts[0]["input_ids"])
    row = full_logits[0][n0 + AT - 1]
    second = int(torch.topk(row, 2).indices[1])
    spec0 = plain[0]["output_ids"][:AT] + [second] + [7] * (NEW - AT - 1)
    specs = [{"id": prompts[0]["id"], "output_ids": spec0}, dict(plain[1])]
    top = torch.topk(row, 2).values
    expected = {
        "position": AT,
        "plain_token": plain[0]["output_ids"][AT],
        "spec_token": second,
        "gap": float(top[0] - top[1]),
    }
    return {"model": model, "prompts": prompts, "plain": plain, "spec": specs, "exp": expected}


def online_record(world) -> dict:
    ids = {p["id"]: p["input_ids"] for p in world["prompts"]}
    runs = {
        name: {"rows": [{**r, "input_ids": ids[r["id"]]} for r in rows]}
        for name, rows in (("plain", world["plain"]), ("eagle3", world["spec"]))
    }
    return {"status": "ok", "mode": "cuda_graph", "modes": {"cuda_graph": {"runs": runs}}}


def test_the_perturbed_position_and_its_gap_are_reported(world, tmp_path):
    exp = world["exp"]
    assert exp["plain_token"] != exp["spec_token"]
    rec = online_record(world)
    plain = io_.rows_of(rec, "x", None, "plain")
    diffs = io_.differences(plain, io_.rows_of(rec, "x", None, "eagle3"), {})
    assert [(d["id"], d["position"]) for d in diffs] == [(world["prompts"][0]["id"], AT)]
    (got,) = io_.logit_gaps(world["model"], diffs)
    assert (got["plain_token"], got["spec_token"]) == (exp["plain_token"], exp["spec_token"])
    assert got["top1_token"] == exp["plain_token"] and got["top2_token"] == exp["spec_token"]
    assert got["gap"] == pytest.approx(exp["gap"], abs=1e-4)
    assert got["emitted_gap"] == pytest.approx(exp["gap"], abs=1e-4)

    path = tmp_path / "online_sglang.json"
    path.write_text(json.dumps(rec))
    out = tmp_path / "table.md"
    assert io_.main(["--online", str(path), "--target", str(TOY), "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("Outputs identical on 1 of 2 prompts.")
    rows = [line for line in text.splitlines() if line.startswith(f"| {world['prompts'][0]['id']}")]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[1:4] == [str(AT), str(exp["plain_token"]), str(exp["spec_token"])]
    assert float(cells[6]) == pytest.approx(exp["gap"], rel=1e-3)


def test_rows_without_prompt_ids_take_them_from_the_dataset(world, tmp_path, capsys):
    plain, spec = tmp_path / "plain.json", tmp_path / "spec.json"
    plain.write_text(json.dumps(world["plain"]))
    spec.write_text(json.dumps({"rows": world["spec"]}))
    args = ["--plain", str(plain), "--spec", str(spec), "--target", str(TOY)]
    assert io_.main(args) == 2
    assert "no prompt ids" in capsys.readouterr().err
    assert io_.main([*args, "--prompts-jsonl", str(HELDOUT)]) == 0
    assert f"| {world['prompts'][0]['id']} | {AT} | " in capsys.readouterr().out


def test_outputs_that_end_early_and_bad_inputs():
    assert io_.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert io_.first_difference([1, 2, 3], [1, 2]) == 2
    assert io_.first_difference([1, 5, 3], [1, 2, 3]) == 1
    with pytest.raises(io_.InputError, match="not of the same prompt ids"):
        io_.differences([{"id": "a", "output_ids": [1]}], [{"id": "b", "output_ids": [1]}], {})
    with pytest.raises(io_.InputError, match="expected rows with 'id' and 'output_ids'"):
        io_.rows_of({"rows": [{"id": "a"}]}, "f.json")
    with pytest.raises(io_.InputError, match="not 'eager'; pick with --mode"):
        io_.rows_of({"modes": {"cuda_graph": {}}}, "f.json", "eager", "plain")


def test_a_difference_in_a_later_turn_is_named_not_recomputed():
    plain = [{"id": "q", "input_ids": [1, 2], "turns": [3, 2], "output_ids": [5, 6, 7, 8, 9]}]
    spec = [{"id": "q", "input_ids": [1, 2], "turns": [3, 2], "output_ids": [5, 6, 7, 8, 4]}]
    (d,) = io_.differences(plain, spec, {})
    assert d["position"] == 4 and d["turn"] == 2 and d["context"] is None
    (r,) = io_.logit_gaps(None, [d])  # no forward pass for it
    assert "| q | 4 (turn 2) | 9 | 4 | not recomputed" in io_.table([r], 1)
    spec[0]["output_ids"] = [5, 3, 7, 8, 9]  # first turn: recomputed from prompt + plain[:1]
    (d,) = io_.differences(plain, spec, {})
    assert d["turn"] == 1 and d["context"] == [1, 2, 5]
