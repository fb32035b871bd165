"""The vLLM export loaded by speculators itself (`SpeculatorModel.from_pretrained`), as vLLM's
speculators path and the speculators tools load it, from another working directory.

speculators 0.9.0 requires transformers<=5.19 and pulls a CUDA torch, so it is not in the
[test] extra: the test installs it (and the modules its import needs) with `pip install
--no-deps --target` into a temporary folder that is appended to sys.path of a subprocess, so
this environment's torch and transformers are the ones used. Needs pip to reach its index.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_export import fake_drafter
from tiny_target import build_llama

from eyrie.export.drafter import export
from eyrie.train.model import Drafter, DrafterConfig, shift_left

# speculators and what `import speculators` needs beyond this environment, pinned
SPECULATORS = [
    "speculators==0.9.0",
    "loguru==0.7.3",
    "openai==3.57.0",
    "httpx==0.28.1",
    "httpcore==1.0.9",
    "jiter==0.19.0",
    "distro==1.9.0",
    "datasets==5.1.0",
    "pyarrow==26.0.1",
    "dill==0.4.1",
    "multiprocess==0.70.19",
    "xxhash==4.1.0",
    "aiohttp==3.14.5",
    "protobuf==7.36.2",
    "hs-connectors==0.9.0",
    "sniffio==1.3.1",
]
T = 128  # speculators' flex-attention block mask is built for 128-token blocks

LOAD = r"""
import json, sys
sys.path.append(sys.argv[1])  # after this environment's packages: its torch and transformers
import torch
from speculators import SpeculatorModel

folder, inputs = sys.argv[2], json.load(open(sys.argv[3]))
model = SpeculatorModel.from_pretrained(folder)
torch.save({"embed": model.embed_tokens.weight.detach()}, "loaded.pt")
with torch.no_grad():
    drafts = model(
        hidden_states=torch.tensor(inputs["aux"]),
        input_ids=torch.tensor(inputs["ids"]),
        document_ids=torch.zeros(1, len(inputs["ids"][0]), dtype=torch.long),
        ttt_steps=1,
    )
json.dump({"class": type(model).__name__, "drafts": drafts[0].tolist()}, open("out.json", "w"))
"""


@pytest.fixture(scope="module")
def speculators_site(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("speculators") / "site"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site)]
    done = subprocess.run([*cmd, *SPECULATORS], capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        pytest.fail(f"pip could not install speculators:\n{done.stderr[-2000:]}")
    return site


@pytest.mark.slow
def test_speculators_loads_the_vllm_export_with_the_targets_embedding(speculators_site, tmp_path):
    target = build_llama(tmp_path / "target", layers=6, hidden=32)
    d = fake_drafter(tmp_path / "drafter", aux_ids=(1, 2, 4), target=target)
    out = tmp_path / "export" / "vllm"
    export(d["dir"], out, "vllm", dtype="float32", target_dir=target)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == str(target.resolve())

    # inputs: aux states in the engine's (ascending layer) order, and token ids
    gen = torch.Generator().manual_seed(0)
    vocab, hidden = d["embed"].shape
    aux = torch.randn(1, T, 3, hidden, generator=gen)
    ids = torch.randint(0, vocab, (1, T), generator=gen)
    # speculators feeds row t the token Eyrie's step 0 reads there, x_{t+1}
    inputs = {"aux": aux.flatten(-2).tolist(), "ids": shift_left(ids, 1).tolist()}
    (tmp_path / "inputs.json").write_text(json.dumps(inputs))

    elsewhere = tmp_path / "elsewhere"  # not the repository, not the export's parent
    elsewhere.mkdir()
    script = tmp_path / "load.py"
    script.write_text(LOAD)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    args = [str(script), str(speculators_site), str(out), str(tmp_path / "inputs.json")]
    done = subprocess.run(
        [sys.executable, *args], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((elsewhere / "out.json").read_text())
    assert result["class"] == "Eagle3DraftModel"

    loaded = torch.load(elsewhere / "loaded.pt", weights_only=True)["embed"]
    target_embed = load_file(str(target / "model.safetensors"))["model.embed_tokens.weight"]
    assert torch.equal(loaded, target_embed)  # float32 export: bit for bit

    # its forward pass drafts what Eyrie's drafter drafts from the same states (step 0)
    meta = json.loads((d["dir"] / "drafter.json").read_text())
    model = Drafter(DrafterConfig.from_dict(meta["config"]))
    model.load_state_dict(load_file(str(d["dir"] / "model.safetensors")))
    with torch.no_grad():
        logits = model(aux, ids, torch.nn.Embedding.from_pretrained(target_embed), steps=1)[0]
    drafts = torch.tensor(result["drafts"])
    assert drafts.shape == (1, T)
    assert torch.equal(drafts, logits.argmax(-1))
