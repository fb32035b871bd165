"""A user's mistake stops the first stage that can see it, with one message naming the input and
the fix, and never as a traceback stages later.

- a train or held-out file with no usable conversation: prepare_dataset and `eyrie dataset`;
- a prompt longer than dataset.max_tokens: a bad line of prepare_dataset (extraction would
  fail it only after the whole extraction);
- a target folder without weights or chat template, a target.architecture config.json does
  not declare: verify_env (file checks, nothing loaded);
- a split emptied later (nothing regenerated, nothing extracted): regenerate, validate_summary,
  and the baselines, each with its own message.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from slurm.workflow import Workflow

from eyrie.data.chat_tokens import SampleError, tokenize_chat
from eyrie.data.dataset import DatasetError, prepare
from eyrie.target.files import TargetError, read_architecture
from eyrie.target.load import load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "models" / "toy-llama"
MAX_TOKENS = 64
SHORT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hey"}]}
LONG = {
    "messages": [
        {"role": "user", "content": "word " * 200},
        {"role": "assistant", "content": "ok"},
    ]
}


def jsonl(path: Path, *lines) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


# ---------------------------------------------------------------- no usable conversation


@pytest.mark.parametrize(
    "lines, says",
    [
        ((), "holds no conversation: it is empty"),
        (("", "  "), "it is empty (2 blank lines)"),
        (("not json", "[1]", '{"messages": []}'), "all 3 of its lines are bad"),
    ],
    ids=["empty", "blank", "all-bad"],
)
def test_prepare_stops_on_a_file_without_a_usable_conversation(tmp_path, lines, says):
    src = jsonl(tmp_path / "train.jsonl", *lines)
    out, csv, kept = tmp_path / "o" / "train.jsonl", tmp_path / "o" / "p.csv", tmp_path / "k.csv"
    with pytest.raises(DatasetError) as err:
        prepare(src, out, csv, split="train", kept_problems_csv=kept)
    msg = str(err.value)
    assert msg.startswith(f"dataset.train: {src} holds no") and says in msg
    if len(lines) == 3:
        assert "(malformed_json: 1, no_messages: 1, not_an_object: 1)" in msg
        assert f"every one is listed in {kept}" in msg and f"The first: {src}:1:" in msg
        assert len(kept.read_text().splitlines()) == 4  # header + 3 problems
    assert not out.exists()  # nothing finished is left for the next stage


def test_eyrie_dataset_exits_1_on_a_file_without_a_usable_conversation(tmp_path, capsys):
    from eyrie.cli.main import main

    empty = jsonl(tmp_path / "empty.jsonl")
    assert main(["dataset", str(empty)]) == 1
    assert f"error: {empty} holds no conversation: it is empty" in capsys.readouterr().err
    bad = jsonl(tmp_path / "bad.jsonl", "{", "{")
    assert main(["dataset", str(bad)]) == 1
    out, err = capsys.readouterr()
    assert out.count("malformed_json") == 3  # each line, then the summary
    assert "all 2 of its lines are bad (malformed_json: 2); every one is listed above" in err
    assert main(["dataset", str(jsonl(tmp_path / "ok.jsonl", SHORT))]) == 0


# ---------------------------------------------------------------- prompts past max_tokens


def test_a_prompt_longer_than_max_tokens_is_a_bad_line_of_prepare(tmp_path):
    src = jsonl(tmp_path / "train.jsonl", SHORT, LONG, {**SHORT, "id": "b"})
    out, csv = tmp_path / "train.jsonl.out", tmp_path / "p.csv"
    counts = prepare(src, out, csv, split="train", target=TOY, max_tokens=MAX_TOKENS)
    assert (counts["good"], counts["written"], counts["by_kind"]) == (2, 2, {"prompt_too_long": 1})
    (row,) = [line for line in csv.read_text().splitlines()[1:]]
    second = len(src.read_bytes().split(b"\n")[0]) + 1  # the byte line 2 starts at
    assert row.startswith(f"{src},2,2,{second},prompt_too_long,")
    assert "raise dataset.max_tokens" in row
    # the same verdicts as extraction's own tokenizer: what prepare keeps, extraction can use
    tok = load_tokenizer(TOY)
    for line in out.read_text().splitlines():
        tokenize_chat(tok, json.loads(line)["messages"], MAX_TOKENS)
    with pytest.raises(SampleError, match="too_long"):
        tokenize_chat(tok, LONG["messages"], MAX_TOKENS)
    with pytest.raises(
        DatasetError, match=r"(?s)train.jsonl:2: prompt_too_long .*on_bad_input: skip"
    ):
        prepare(src, out, csv, on_bad="fail", split="train", target=TOY, max_tokens=MAX_TOKENS)


def test_a_split_whose_prompts_are_all_too_long_stops_prepare(tmp_path, capsys):
    from eyrie.cli.main import main

    src = jsonl(tmp_path / "heldout.jsonl", LONG, LONG)
    with pytest.raises(DatasetError, match="all 2 of its lines are bad \\(prompt_too_long: 2\\)"):
        prepare(src, tmp_path / "o", tmp_path / "p", split="heldout", target=TOY, max_tokens=64)
    args = ["dataset", str(src), "--target", str(TOY), "--max-tokens", "64"]
    assert main(args) == 1
    assert "prompt_too_long" in capsys.readouterr().err
    assert main([*args[:-1], "4096"]) == 0


def test_prepare_dataset_job_stops_on_an_all_bad_train_file(tmp_path):
    wf = Workflow.scratch(
        tmp_path / "wd",
        {"target": {"path": "models/toy-llama"}, "dataset": {"train": "bad.jsonl"}},
    )
    jsonl(wf.path("bad.jsonl"), "not json", "[1]")
    log = wf.run("--", "results/data/train.jsonl", check=False, timeout=300)
    table = "results/logs/prepare_dataset/train.problems.csv"
    assert (
        "error: dataset.train: bad.jsonl holds no usable conversation: all 2 of its lines are "
        f"bad (malformed_json: 1, not_an_object: 1); every one is listed in {table}."
    ) in log
    assert "Traceback" not in log and "Error in rule prepare_dataset" in log
    assert not wf.path("results/data/train.jsonl").exists()
    assert len(wf.path(table).read_text().splitlines()) == 3


# ---------------------------------------------------------------- the target folder


@pytest.fixture
def folder(tmp_path) -> Path:
    dst = tmp_path / "target"
    shutil.copytree(TOY, dst)
    return dst


def test_verify_env_checks_refuse_a_folder_extraction_could_not_load(folder):
    from eyrie.verify.stage import check_target_files

    check_target_files(folder)
    (folder / "chat_template.jinja").unlink()
    with pytest.raises(TargetError, match="has no chat template.*add chat_template.jinja"):
        check_target_files(folder)
    with pytest.raises(TargetError, match="has no chat template"):  # and prepare_dataset
        prepare(jsonl(folder / "d.jsonl", SHORT), folder / "o", folder / "p", target=folder,
                max_tokens=64)  # fmt: skip
    (folder / "chat_template.jinja").write_text((TOY / "chat_template.jinja").read_text())
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with pytest.raises(TargetError, match="no \\*.safetensors weights \\(it has pytorch_model"):
        check_target_files(folder)
    (folder / "pytorch_model.bin").rename(folder / "model-00001-of-00002.safetensors")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-2.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(TargetError, match="names 1 weight file.*model-2.safetensors"):
        check_target_files(folder)


def test_an_architecture_config_json_does_not_declare_is_refused(folder):
    from eyrie.verify.stage import check_target_files, run_stage

    assert read_architecture(folder, "LlamaForCausalLM") == "LlamaForCausalLM"
    with pytest.raises(TargetError, match="declares \\['LlamaForCausalLM'\\]") as err:
        read_architecture(folder, "MistralForCausalLM")
    assert "target.architecture is 'MistralForCausalLM'" in str(err.value)
    with pytest.raises(TargetError, match="MistralForCausalLM"):
        check_target_files(folder, "MistralForCausalLM")
    with pytest.raises(TargetError, match="MistralForCausalLM"):  # the hf check built Llama
        run_stage(folder, "hf", architecture="MistralForCausalLM")


def test_verify_env_job_stops_on_a_folder_without_chat_template(tmp_path):
    wf = Workflow.scratch(tmp_path / "wd", {"target": {"path": "models/toy-llama"}})
    wf.path("models/toy-llama/chat_template.jinja").unlink()
    log = wf.run("--", "results/verify/report.json", check=False, timeout=300)
    assert "error: target.path: the tokenizer in models/toy-llama has no chat template" in log
    assert "Traceback" not in log and not wf.path("results/verify/report.json").exists()


# ---------------------------------------------------------------- emptied later


def test_regenerate_stops_when_no_conversation_was_regenerated(tmp_path):
    from eyrie.regenerate.hf import Answer
    from eyrie.regenerate.stage import RegenerateError, SplitJob, regenerate_split

    class Silent:
        def generate(self, prompts):
            return [Answer([], stopped=True) for _ in prompts]

    data = jsonl(tmp_path / "train.jsonl", SHORT, {**SHORT, "id": "b"})
    job = SplitJob(data=data, target=TOY, out=tmp_path / "regen" / "train.jsonl", split="train")
    settings = {"max_new_tokens": 8, "chunk": 4, "seed": 0}
    tok = load_tokenizer(TOY)
    with pytest.raises(RegenerateError) as err:
        regenerate_split(
            job, settings, progress=False, generator_factory=lambda *a: (Silent(), tok, 512)
        )
    msg = str(err.value)
    assert f"none of the 2 conversations of {data} was regenerated (empty_answer: 2)" in msg
    assert "chat template" in msg and "regenerate.enabled: false" in msg
    assert not job.out.exists() and not (job.out.parent / ".work" / "train.jsonl").exists()


def test_a_missing_regenerated_split_names_the_regenerate_rule(tmp_path):
    from eyrie.common.errors import ExtractError
    from eyrie.common.layout import Layout
    from eyrie.data.split import read_split

    lay = Layout(tmp_path)
    with pytest.raises(ExtractError, match="run the regenerate rule"):
        read_split(lay.regenerated("train"))
    with pytest.raises(ExtractError, match="run the prepare_dataset rule"):
        read_split(lay.dataset("train"))


def _empty_store(path: Path) -> Path:
    from eyrie.store.shard import ShardWriter

    with ShardWriter(path, hidden_size=8, aux_layer_ids=[0, 1, 2], provenance={},
                     chunk_tokens=16, shard_tokens=64) as w:  # fmt: skip
        w.finish()
    return path


def test_a_split_with_no_stored_sample_fails_validation_whatever_max_errors(tmp_path):
    from eyrie.validate.summary import summarize

    reports = []
    for split, samples in (("train", 3), ("heldout", 0)):
        rep = {"split": split, "shard": "000", "store": str(tmp_path / split), "samples": samples}
        rep.update(errors=2, error_counts={"extract:too_long": 2}, errors_csv=f"{split}.csv")
        reports.append(tmp_path / f"{split}.json")
        reports[-1].write_text(json.dumps(rep))
    ok, msg = summarize(reports, tmp_path / "s.csv", tmp_path / "s.md", max_errors=100)
    assert not ok
    assert msg.startswith(
        "validation: split heldout stored no sample in its 1 shard(s); its 2 errors are listed "
        "in heldout.csv"
    )


def test_baselines_on_stores_without_samples_name_them(tmp_path):
    import torch

    from eyrie.evaluate.baselines import BaselineError, read_rows

    store = _empty_store(tmp_path / "shard-000.zarr")
    with pytest.raises(BaselineError, match=f"the stores {store} hold no position to score"):
        read_rows([store], torch.zeros(4, 8), max_len=64)
