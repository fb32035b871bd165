"""patch_server's bundle for three real SGLang releases, and the import hook at work.

Bundles are built from verify reports of the real source of 0.5.9, 0.5.12 and 0.5.23 (wheels
fetched once by eyrie.verify.source). The mechanism each release gets is checked against plain
text searches of its source, so a wrong AST walk and a wrong expectation must agree to pass.
The import hook runs in a fresh interpreter (as SGLang's scheduler is) against a small package
named and shaped like SGLang's: a model module, a ForwardBatch without rids, a worker batch that
holds the requests.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from eyrie.extract.sglang import DumpFolder, SglangError
from eyrie.sglang.patch import SERVER_MODULES
from eyrie.sglang.patch import protocol as proto
from eyrie.sglang.patch.bundle import build_bundle, check_installed, server_args, server_env
from eyrie.sglang.patch.manifest import load_manifest
from eyrie.sglang.patch.settings import PatchError
from eyrie.verify.source import VerifyError, from_folder, locate
from eyrie.verify.stage import check_sglang

RELEASES = ["0.5.9", "0.5.12", "0.5.23"]
DSV3, KIMI = "DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration"
PKG = Path(__file__).resolve().parent.parent / "eyrie" / "sglang" / "patch"


@pytest.fixture(scope="module")
def releases():
    try:
        return {v: locate(f"pip:{v}") for v in RELEASES}
    except VerifyError as exc:
        pytest.skip(f"cannot fetch SGLang's source here: {exc}")


def write_report(tmp: Path, source, arch: str, layers: int, aux: list[int]) -> Path:
    check = check_sglang(source, [arch], num_layers=layers, aux_ids=aux)
    report = {"backend": "sglang", "sglang": [check], "hf": [], "failures": [], "ok": True}
    path = tmp / f"report-{source.version}-{arch}.json"
    path.write_text(json.dumps(report))
    return path


def text_facts(source) -> dict:
    """What the release has, by plain text search (independent of the bundle's AST reading)."""
    root = source.package
    fb = (root / "srt/model_executor/forward_batch_info.py").read_text()
    body = fb[fb.index("class ForwardBatch") :]
    body = body[: body.index("\nclass ", 1)] if "\nclass " in body[1:] else body
    args = (root / "srt/server_args.py").read_text()
    args += "".join(p.read_text() for p in (root / "srt").glob("arg_groups/**/*.py"))
    return {
        "rids": re.search(r"^\s+rids\s*:", body, re.M) is not None,
        "hooks": (root / "srt/model_executor/hook_manager.py").is_file()
        and ('"--forward-hooks"' in args or re.search(r"^\s+forward_hooks\s*:", args, re.M)),
        "piecewise": re.search(r"^\s+disable_piecewise_cuda_graph\s*:", args, re.M) is not None,
    }


@pytest.mark.parametrize("version", RELEASES)
def test_each_release_gets_the_mechanism_its_source_allows(releases, tmp_path, version):
    src = releases[version]
    facts = text_facts(src)
    manifest = build_bundle(write_report(tmp_path, src, DSV3, 8, [1, 3, 4]), tmp_path / "b")
    expected = "forward_hooks" if facts["hooks"] and facts["rids"] else "import_hook"
    assert manifest["mechanism"] == expected
    assert {"0.5.9": "import_hook"}.get(version, "forward_hooks") == expected  # read by hand
    why = manifest["mechanism_why"]
    if expected == "import_hook":
        assert "no rids" in why and "ModelWorkerBatch.reqs" in why
        assert manifest["import_hook"]["add_rids"] is True
        assert (tmp_path / "b" / "python" / "sitecustomize.py").is_file()
    else:
        assert "--forward-hooks" in why and "no module of it is patched" in why
        assert not (tmp_path / "b" / "python" / "sitecustomize.py").exists()
    assert manifest["hook_modules"] == {
        "start": "model.layers.0",
        "aux": ["model.layers.1", "model.layers.3", "model.layers.4"],
        "final": "model.norm",
    }
    assert manifest["import_hook"]["module"] == "sglang.srt.models.deepseek_v2"
    assert ("--disable-piecewise-cuda-graph" in manifest["server_flags"]) == facts["piecewise"]
    assert {"--skip-tokenizer-init", "--disable-radix-cache", "--disable-cuda-graph"} <= set(
        manifest["server_flags"]
    )
    # every hashed file exists in the verified source and hashes as recorded
    files = manifest["sglang"]["files"]
    assert "sglang/srt/models/deepseek_v2.py" in files
    assert "sglang/srt/model_executor/forward_batch_info.py" in files
    for rel, digest in files.items():
        assert proto.sha256_file(src.root / rel) == digest
    check_installed(manifest, src.package)
    # the server-side code travels verbatim
    for name in SERVER_MODULES:
        shipped = tmp_path / "b" / "python" / "eyrie_sglang_patch" / name
        assert shipped.read_text() == (PKG / name).read_text()


@pytest.mark.parametrize(
    ("version", "verdict", "mechanism"),
    [("0.5.9", "patchable", "import_hook"), ("0.5.12", "ok", "forward_hooks")],
)
def test_the_kimi_wrapper_is_captured_on_its_inner_model(
    releases, tmp_path, version, verdict, mechanism
):
    report = write_report(tmp_path, releases[version], KIMI, 61, [1, 29, 57])
    manifest = build_bundle(report, tmp_path / "b")
    assert (manifest["verdict"], manifest["mechanism"]) == (verdict, mechanism)
    assert manifest["layers_holder"] == "model.language_model.model"
    assert manifest["hook_modules"]["aux"] == [
        "language_model.model.layers.1",
        "language_model.model.layers.29",
        "language_model.model.layers.57",
    ]
    assert manifest["hook_modules"]["final"] == "language_model.model.norm"
    hook = manifest["import_hook"]
    assert hook["holder"] == "language_model.model"
    assert hook["call_on"] == ("language_model" if verdict == "patchable" else "")
    assert hook["module"] == "sglang.srt.models.kimi_k25" and hook["class"] == KIMI
    assert manifest["pass_to_sglang"] == [1, 29, 57]


def test_choices_that_cannot_work_are_refused(releases, tmp_path):
    r9 = write_report(tmp_path, releases["0.5.9"], DSV3, 8, [1, 3, 4])
    with pytest.raises(PatchError, match="cannot use it: its ForwardBatch has no rids"):
        build_bundle(r9, tmp_path / "b", mechanism="forward_hooks")
    with pytest.raises(PatchError, match=r"made for aux ids \[1, 3, 4\].*\[1, 2, 3\]"):
        build_bundle(r9, tmp_path / "b", aux_layer_ids=[1, 2, 3])
    # a release without --forward-hooks falls back to the import hook
    r12 = write_report(tmp_path, releases["0.5.12"], DSV3, 8, [1, 3, 4])
    report = json.loads(r12.read_text())
    report["sglang"][0]["release"]["forward_hooks"] = {"available": False, "evidence": []}
    r12.write_text(json.dumps(report))
    manifest = build_bundle(r12, tmp_path / "b")
    assert (
        manifest["mechanism"] == "import_hook" and "no --forward-hooks" in manifest["mechanism_why"]
    )
    assert manifest["import_hook"]["add_rids"] is False  # 0.5.12 has them
    with pytest.raises(PatchError, match="no SGLang check"):
        (tmp_path / "hf.json").write_text(json.dumps({"backend": "hf", "sglang": []}))
        build_bundle(tmp_path / "hf.json", tmp_path / "b")


def test_a_changed_installation_or_bundle_is_refused(releases, tmp_path):
    src = releases["0.5.12"]
    report = write_report(tmp_path, src, DSV3, 8, [1, 3, 4])
    manifest = build_bundle(report, tmp_path / "b")
    again = build_bundle(report, tmp_path / "b2")
    assert again == manifest  # no timestamps: rebuilding does not invalidate stores
    copy = tmp_path / "installed"
    for rel in manifest["sglang"]["files"]:
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src.root / rel, copy / rel)
    check_installed(manifest, copy / "sglang")
    with open(copy / "sglang/srt/models/deepseek_v2.py", "a") as f:
        f.write("\n# local edit\n")
    with pytest.raises(PatchError, match=r"not the one verified.*deepseek_v2.py \(changed\)"):
        check_installed(manifest, copy / "sglang")
    shipped = tmp_path / "b" / "python" / "eyrie_sglang_patch" / "dump.py"
    shipped.write_text(shipped.read_text() + "\n")
    with pytest.raises(PatchError, match="bundled files changed"):
        load_manifest(tmp_path / "b")


def test_launch_script_and_hook_specs_agree(releases, tmp_path):
    report = write_report(tmp_path, releases["0.5.12"], DSV3, 8, [1, 3, 4])
    manifest = build_bundle(report, tmp_path / "b")
    launch = tmp_path / "b" / "launch.sh"
    assert subprocess.run(["bash", "-n", str(launch)]).returncode == 0
    text = launch.read_text()
    assert "--disable-radix-cache" in text and '--forward-hooks "$hooks"' in text
    printed = subprocess.run(
        [sys.executable, "-m", "eyrie_sglang_patch.hooks", str(tmp_path / "b/manifest.json")]
        + ["/dev/shm/x", "eyrie-"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "b" / "python")},
        check=True,
    ).stdout
    args = server_args(tmp_path / "b", manifest, "/dev/shm/x", "eyrie-")
    assert json.loads(printed) == json.loads(args[args.index("--forward-hooks") + 1])


# ---------------------------------------------------------------------------------------------
# the import hook, against a package shaped like SGLang's

FAKE = {
    "sglang/__init__.py": "",
    "sglang/version.py": '__version__ = "0.0.0.fake"\n',
    "sglang/srt/__init__.py": "",
    "sglang/srt/managers/__init__.py": "",
    "sglang/srt/model_executor/__init__.py": "",
    "sglang/srt/models/__init__.py": "",
    "sglang/srt/managers/schedule_batch.py": """
        from dataclasses import dataclass
        from typing import List, Optional


        @dataclass
        class ModelWorkerBatch:
            forward_mode: object
            input_ids: object
            positions: object
            extend_seq_lens: list
            extend_prefix_lens: list
            reqs: Optional[List] = None
        """,
    "sglang/srt/model_executor/forward_batch_info.py": """
        from dataclasses import dataclass


        class ForwardMode:
            def __init__(self, extend):
                self.extend = extend

            def is_extend(self):
                return self.extend


        @dataclass
        class ForwardBatch:
            forward_mode: ForwardMode
            input_ids: object
            positions: object
            extend_seq_lens_cpu: list = None
            extend_prefix_lens_cpu: list = None

            @classmethod
            def init_new(cls, batch, model_runner=None):
                return cls(
                    batch.forward_mode,
                    batch.input_ids,
                    batch.positions,
                    batch.extend_seq_lens,
                    batch.extend_prefix_lens,
                )
        """,
    "sglang/srt/models/deepseek_v2.py": """
        import torch
        from torch import nn


        class DeepseekV2DecoderLayer(nn.Module):
            def __init__(self, hidden):
                super().__init__()
                self.mlp = nn.Linear(hidden, hidden)

            def forward(self, positions, hidden_states, forward_batch, residual):
                residual = hidden_states if residual is None else hidden_states + residual
                return torch.tanh(self.mlp(residual)), residual


        class DeepseekV2Model(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.embed_tokens = nn.Embedding(config["vocab"], config["hidden"])
                self.layers = nn.ModuleList(
                    DeepseekV2DecoderLayer(config["hidden"]) for _ in range(config["layers"])
                )
                self.norm = nn.LayerNorm(config["hidden"])
                self.layers_to_capture = []

            def forward(self, input_ids, positions, forward_batch):
                hidden_states, residual = self.embed_tokens(input_ids), None
                aux_hidden_states = []
                for i in range(len(self.layers)):
                    if i in self.layers_to_capture:
                        aux_hidden_states.append(
                            hidden_states if residual is None else hidden_states + residual
                        )
                    hidden_states, residual = self.layers[i](
                        positions, hidden_states, forward_batch, residual
                    )
                hidden_states = self.norm(hidden_states + residual)
                if len(aux_hidden_states) == 0:
                    return hidden_states
                return hidden_states, aux_hidden_states


        class DeepseekV2ForCausalLM(nn.Module):
            def __init__(self, config):
                super().__init__()
                self.model = DeepseekV2Model(config)
                self.capture_aux_hidden_states = False

            def forward(self, input_ids, positions, forward_batch):
                hidden_states = self.model(input_ids, positions, forward_batch)
                if self.capture_aux_hidden_states:
                    hidden_states, aux_hidden_states = hidden_states
                return hidden_states

            def set_eagle3_layers_to_capture(self, layer_ids=None):
                self.capture_aux_hidden_states = True
                self.model.layers_to_capture = [val + SHIFT for val in layer_ids]


        class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
            pass


        EntryClass = [DeepseekV2ForCausalLM, DeepseekV3ForCausalLM]
        """,
}

# Runs in a fresh interpreter: the patch is active only through sitecustomize.
SERVER = """
import json, sys, torch
from safetensors.torch import save_file
from sglang.srt.managers.schedule_batch import ModelWorkerBatch
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.models.deepseek_v2 import DeepseekV3ForCausalLM

torch.manual_seed(0)
model = DeepseekV3ForCausalLM({"vocab": 50, "hidden": 8, "layers": 6})
ref = {}
for i, layer in enumerate(model.model.layers):  # independent of the patch: plain torch hooks
    layer.register_forward_hook(lambda m, a, o, i=i: ref.setdefault(i, []).append(o[0] + o[1]))
model.model.norm.register_forward_hook(lambda m, a, o: ref.setdefault("final", []).append(o))

class Req:
    def __init__(self, rid):
        self.rid = rid

passes = json.loads(sys.argv[1])
for spec in passes:
    ids = torch.cat([torch.arange(p, p + n) * 3 % 50 + k for k, (_, p, n) in enumerate(spec)])
    pos = torch.cat([torch.arange(p, p + n) for _, p, n in spec])
    mwb = ModelWorkerBatch(ForwardMode(True), ids, pos, [s[2] for s in spec],
                           [s[1] for s in spec], [Req(s[0]) for s in spec])
    fb = ForwardBatch.init_new(mwb, None)
    rids = getattr(fb, "rids", None)
    assert rids in (None, [s[0] for s in spec]), rids
    with torch.no_grad():
        model(fb.input_ids, fb.positions, fb)
out = {f"layer{k}": torch.cat(v) for k, v in ref.items() if k != "final"}
out["final"] = torch.cat(ref["final"])
save_file({k: v.detach().contiguous() for k, v in out.items()}, sys.argv[2])
wrapped = hasattr(DeepseekV3ForCausalLM.__init__, "__wrapped__")
print("patched" if wrapped else "plain", rids is not None)
"""

PASSES = [
    [["HEALTH_CHECK_1", 0, 2], ["eyrie-x:a", 0, 5], ["eyrie-x:b", 0, 4]],
    [["eyrie-x:b", 4, 3], ["warmup-0", 0, 3]],
]


@pytest.fixture
def fake_release(tmp_path):
    root = tmp_path / "site"
    for rel, text in FAKE.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text).replace("SHIFT", "1"))
    check = check_sglang(from_folder(root), [DSV3], num_layers=6, aux_ids=[3, 1])
    (tmp_path / "report.json").write_text(json.dumps({"backend": "sglang", "sglang": [check]}))
    return root, build_bundle(tmp_path / "report.json", tmp_path / "patch")


def run_server(tmp_path, root, manifest, env_extra=None, patched=True):
    dump = tmp_path / "dump"
    base = {**os.environ, "PYTHONPATH": str(root)}
    env = server_env(tmp_path / "patch", manifest, dump, "eyrie-x:", base) if patched else base
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-c", SERVER, json.dumps(PASSES), str(tmp_path / "ref.safetensors")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )


def test_the_import_hook_captures_in_a_fresh_interpreter(fake_release, tmp_path):
    from safetensors.torch import load_file

    root, manifest = fake_release
    assert manifest["mechanism"] == "import_hook"  # no --forward-hooks in this release
    assert "no --forward-hooks" in manifest["mechanism_why"]
    assert manifest["import_hook"]["add_rids"] is True  # its ForwardBatch has no rids
    assert manifest["pass_to_sglang"] == [3, 1] and manifest["layers_to_capture"] == [4, 2]
    done = run_server(tmp_path, root, manifest)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["patched", "True"]  # and the batches carried rids
    ref = load_file(str(tmp_path / "ref.safetensors"))
    folder = DumpFolder(
        tmp_path / "dump", proto.sha256_file(tmp_path / "patch/manifest.json"), tmp_path
    )
    status = folder.check_loaded("import_hook", "eyrie-x:", wait_s=0)
    assert status[0]["mechanism"] == "import_hook" and status[0]["files_ok"]
    assert sorted(p.name.split(".")[1] for p in folder.path.glob("*.safetensors")) == [
        "0000000000",
        "0000000000",
        "0000000004",
    ]  # a, then b in two chunks; the health check and the warm-up left nothing
    rows = {"eyrie-x:a": [(0, 2, 7)], "eyrie-x:b": [(0, 7, 11), (1, 0, 3)]}  # (pass, from, to)
    sizes = [sum(s[2] for s in spec) for spec in PASSES]
    for rid, spans in rows.items():
        idx = torch.cat([sum(sizes[:p]) + torch.arange(a, b) for p, a, b in spans])
        aux, final = folder.collect(rid, _ids_of(rid), timeout=1)
        assert torch.equal(aux[:, 0], ref["layer3"][idx])  # slot 0 is aux id 3
        assert torch.equal(aux[:, 1], ref["layer1"][idx])
        assert torch.equal(final, ref["final"][idx])


def _ids_of(rid: str):
    """The token ids the fake server script gives a request (see SERVER)."""
    out = []
    for spec in PASSES:
        for k, (r, p, n) in enumerate(spec):
            if r == rid:
                out.append(torch.arange(p, p + n) * 3 % 50 + k)
    return torch.cat(out).numpy()


def test_the_import_hook_refuses_what_was_not_verified(fake_release, tmp_path):
    root, manifest = fake_release
    done = run_server(tmp_path, root, manifest, patched=False)
    assert done.returncode == 0 and done.stdout.split() == ["plain", "False"], done.stderr
    assert not (tmp_path / "dump").exists()
    # a release whose setter shifts ids differently from the verified rule
    model_file = root / "sglang/srt/models/deepseek_v2.py"
    model_file.write_text(model_file.read_text().replace("val + 1", "val + 0"))
    done = run_server(tmp_path, root, manifest)
    assert done.returncode != 0
    assert (
        "differs from the one verified" in done.stderr and "deepseek_v2.py (changed)" in done.stderr
    )
    # the same change, re-verified: the verify stage now expects other ids, the run agrees
    manifest["sglang"]["files"]["sglang/srt/models/deepseek_v2.py"] = proto.sha256_file(model_file)
    (tmp_path / "patch/manifest.json").write_text(json.dumps(manifest))
    done = run_server(tmp_path, root, manifest)
    assert done.returncode != 0 and "shift rule is not the verified one" in done.stderr
    assert "layers_to_capture [1, 3], not [2, 4]" in done.stderr


def test_sitecustomize_runs_the_one_it_shadows(fake_release, tmp_path):
    root, manifest = fake_release
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['SHADOWED_RAN'] = '1'\n")
    env = server_env(tmp_path / "patch", manifest, tmp_path / "dump", "eyrie-x:")
    env["PYTHONPATH"] += os.pathsep + str(other)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, sys; print(os.environ.get('SHADOWED_RAN'), "
            "any(type(f).__name__ == 'PatchFinder' for f in sys.meta_path))",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.stdout.split() == ["1", "True"], done.stderr


def test_a_broken_manifest_is_reported_not_silent(fake_release, tmp_path):
    root, manifest = fake_release
    env = server_env(tmp_path / "patch", manifest, tmp_path / "dump", "eyrie-x:")
    proto.ensure_private_dir(tmp_path / "dump")
    env["EYRIE_PATCH_MANIFEST"] = str(tmp_path / "missing.json")
    done = subprocess.run([sys.executable, "-c", "pass"], capture_output=True, text=True, env=env)
    assert done.returncode == 0 and "import hook was not installed" in done.stderr
    folder = DumpFolder(tmp_path / "dump", "0" * 64, tmp_path)
    with pytest.raises(SglangError, match="import hook was not installed"):
        folder.check_loaded("import_hook", "eyrie-x:", wait_s=0)
