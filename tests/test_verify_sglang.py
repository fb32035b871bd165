"""The SGLang verify check against the real source of three releases (wheels from PyPI).

What each release really does was read by hand from its source; the tests also re-derive the
main facts with plain text searches, so a wrong AST walk and a wrong expectation must agree to
pass.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from eyrie.cli.main import main
from eyrie.verify import source as source_mod
from eyrie.verify.chain import ChainAnalyzer
from eyrie.verify.pyindex import SourceIndex
from eyrie.verify.registry import entry_classes, release_facts
from eyrie.verify.report import verify_arch
from eyrie.verify.shift import ShiftError
from eyrie.verify.source import VerifyError, locate
from eyrie.verify.stage import all_entries_of, analyzer, check_sglang

RELEASES = ["0.5.9", "0.5.12", "0.5.23"]
KIMI = "KimiK25ForConditionalGeneration"
DSV3 = "DeepseekV3ForCausalLM"
LLAMA = "LlamaForCausalLM"


@pytest.fixture(scope="session")
def releases():
    """Each release's source, fetched once into the cache (pip download --no-deps)."""
    probe = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "sglang"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        pytest.skip("the package index is unreachable here (CI has it): cannot fetch sglang")
    return {v: locate(f"pip:{v}") for v in RELEASES}


@pytest.fixture(scope="session")
def checks(releases):
    """The full report of the seed's chain and two common targets, per release."""
    return {
        v: check_sglang(src, [KIMI, DSV3, LLAMA], num_layers=61, aux_ids=[1, 29, 57])
        for v, src in releases.items()
    }


def _target(checks, version, arch):
    return next(t for t in checks[version]["targets"] if t["architecture"] == arch)


def _read(src, rel):
    return (src.root / rel).read_text()


def test_releases_have_the_requested_versions(releases):
    for version, src in releases.items():
        assert src.version == version
        assert (src.package / "srt" / "models" / "kimi_k25.py").is_file()


@pytest.mark.parametrize("version", RELEASES)
def test_seed_chain_verdicts(checks, releases, version):
    """0.5.9's Kimi wrapper lacks the method (patchable); 0.5.12+ passes it on (ok)."""
    kimi = _target(checks, version, KIMI)
    text = _read(releases[version], "sglang/srt/models/kimi_k25.py")
    has_method = "def set_eagle3_layers_to_capture" in text
    expected = "ok" if has_method else "patchable"
    assert kimi["verdict"] == expected == ("patchable" if version == "0.5.9" else "ok")
    assert kimi["layers_holder"] == "model.language_model.model"
    classes = [lvl["class"] for lvl in kimi["chain"]]
    assert classes == [KIMI, DSV3, "DeepseekV2Model"]
    assert kimi["chain"][1]["bases"][0] == "DeepseekV2ForCausalLM"
    if version == "0.5.9":
        assert kimi["delegation"]["found"] is False
        assert kimi["patch"]["action"] == "enable_inner"
        assert kimi["patch"]["call_on"] == "model.language_model"
        assert kimi["capture_path"] == "model.language_model"
    else:
        assert kimi["delegation"]["found"] is True
        assert kimi["delegation"]["to"] == ["model.language_model"]
        assert kimi["delegation"]["raises"], "0.5.12+ raises when language_model lacks it"
        assert kimi["patch"]["action"] == "none"


@pytest.mark.parametrize("version", RELEASES)
def test_deepseek_and_llama_are_ok(checks, version):
    for arch, holder in [(DSV3, "DeepseekV2Model"), (LLAMA, "LlamaModel")]:
        res = _target(checks, version, arch)
        assert res["verdict"] == "ok", res["why"]
        assert res["layers_holder"] == "model.model"
        assert res["chain"][-1]["class"] == holder
        assert res["chain"][-1]["layers_to_capture_used"]
        assert res["default_ids"][0]["expr"] == "[2, num_layers // 2, num_layers - 3]"
        top = res["chain"][0]
        assert top["capture_flag_init"] and top["forward_checks_flag"]
        assert top["forward_unpacks_aux"]


def test_shift_rule_per_release(checks, releases):
    """0.5.9 and 0.5.12 add 1 to every id; 0.5.23's DeepSeek adds 1 only when the first id is 1,
    while its Llama still always adds 1."""
    for version in RELEASES:
        text = _read(releases[version], "sglang/srt/models/deepseek_v2.py")
        conditional = "layer_ids[0] == 1" in text
        rule = _target(checks, version, DSV3)["shift_rule"]
        assert rule["kind"] == ("conditional" if conditional else "always+1")
        assert conditional == (version == "0.5.23")
        assert _target(checks, version, LLAMA)["shift_rule"]["kind"] == "always+1"
        assert _target(checks, version, KIMI)["shift_rule"] == rule
    cases = _target(checks, "0.5.23", DSV3)["shift_rule"]["steps"][0]["cases"]
    assert [c["add"] for c in cases] == [1, 0]
    assert cases[0]["when"] == ["layer_ids and layer_ids[0] == 1"]


def test_shift_rule_applies_and_solves(releases):
    new = ChainAnalyzer(SourceIndex(releases["0.5.23"].root))
    old = ChainAnalyzer(SourceIndex(releases["0.5.12"].root))
    entries_new = entry_classes(new.index, {DSV3})
    entries_old = entry_classes(old.index, {DSV3})
    rule_new = new.shift_rule(new.reach(entries_new[DSV3].cls))
    rule_old = old.shift_rule(old.reach(entries_old[DSV3].cls))
    assert rule_new.apply([1, 29, 57]) == [2, 30, 58]
    assert rule_new.apply([3, 29, 57]) == [3, 29, 57]
    assert rule_old.apply([3, 29, 57]) == [4, 30, 58]
    assert rule_old.ids_for([0, 5, 9]) == [0, 5, 9]
    assert rule_new.ids_for([1, 29, 57]) == [1, 29, 57]
    assert rule_new.ids_for([2, 29, 57]) == [3, 30, 58]
    with pytest.raises(ShiftError, match="layer"):
        rule_new.ids_for([0, 29, 57])  # layer 0's output cannot be asked for there


def test_layer_ids_in_report(checks):
    ids = _target(checks, "0.5.23", KIMI)["layer_ids"]
    assert ids == {"aux_ids": [1, 29, 57], "layers_to_capture": [2, 30, 58],
                   "pass_to_sglang": [1, 29, 57]}  # fmt: skip


def test_runner_behaviour(checks, releases):
    """How the runner calls the switch: unchecked in 0.5.9/0.5.12, hasattr + raise in 0.5.23."""
    expect = {"0.5.9": {"blind"}, "0.5.12": {"blind"}, "0.5.23": {"raises"}}
    for version in RELEASES:
        runner = checks[version]["release"]["runner"]
        assert {c["behaviour"] for c in runner["calls"]} == expect[version]
        files = {c["file"] for c in runner["calls"]}
        greps = {
            p.relative_to(releases[version].root).as_posix()
            for p in (releases[version].package / "srt").rglob("*.py")
            if "/models/" not in p.as_posix()
            and re.search(r"\.set_eagle3_layers_to_capture\(", p.read_text())
        }
        assert files == greps
    no_ids = [c for c in checks["0.5.9"]["release"]["runner"]["calls"] if "no ids" in c["args"]]
    assert len(no_ids) == 2  # cuda_graph_runner and _dummy_run reset to the model's default


def test_forward_hooks_found(checks, releases):
    for version in RELEASES:
        hooks = checks[version]["release"]["forward_hooks"]
        assert hooks["available"] is (releases[version].package / "srt" / "model_executor" /
                                      "hook_manager.py").is_file()  # fmt: skip
        assert hooks["available"]


def _cited(node):
    if isinstance(node, dict):
        if {"file", "line", "text"} <= node.keys() and isinstance(node["line"], int):
            yield node
        for value in node.values():
            yield from _cited(value)
    elif isinstance(node, list):
        for value in node:
            yield from _cited(value)


def test_every_citation_holds_its_text(checks, releases):
    count = 0
    for version, check in checks.items():
        for cite in _cited(check):
            if not cite["line"]:
                continue
            lines = (releases[version].root / cite["file"]).read_text().splitlines()
            assert lines[cite["line"] - 1].strip() == cite["text"], cite
            count += 1
    assert count > 60


def test_registry_of_0_5_23(releases):
    src = releases["0.5.23"]
    entries = all_entries_of(src)
    # independent count: class names in every EntryClass line of the top-level model modules
    names = set()
    for path in sorted((src.package / "srt" / "models").glob("*.py")):
        m = re.search(r"^EntryClass = (\[.*?\]|\w+)", path.read_text(), re.M | re.S)
        if m:
            names |= set(re.findall(r"\b([A-Z]\w+)\b", m.group(1)))
    assert set(entries) == names
    report = check_sglang(src, [], all_entries=True)["registry"]
    assert sum(report["counts"].values()) == len(entries)
    rows = {r["architecture"]: r for r in report["rows"]}
    assert rows[KIMI]["verdict"] == "ok"
    assert rows["LlavaLlamaForCausalLM"]["verdict"] == "patchable"
    assert rows["LlavaLlamaForCausalLM"]["capture_path"] == "model.language_model"
    # mindspore picks its model class at run time: reported unresolved, never guessed
    assert rows["MindSporeForCausalLM"]["verdict"] == "unsupported"
    assert "cannot be resolved" in rows["MindSporeForCausalLM"]["why"]
    # a model with no capture code at all
    assert "set_eagle3" not in (src.package / "srt" / "models" / "bert.py").read_text()
    assert rows["BertModel"]["verdict"] == "unsupported"
    # every ok row's module (or a base's) really defines the method somewhere in its chain
    ok = [r for r in report["rows"] if r["verdict"] == "ok"]
    assert len(ok) >= 20


def test_unknown_architecture(releases):
    an, facts = analyzer(releases["0.5.23"])
    res = verify_arch(an, facts, {}, "DeepseekV3ForCausalLMX")
    assert res["verdict"] == "unsupported"
    assert "registers no model class" in res["why"] and DSV3 in res["why"]


def test_cli_verdicts_and_strict(releases, tmp_path, capsys):
    folder = str(releases["0.5.9"].root)
    out_json, out_md = tmp_path / "r.json", tmp_path / "r.md"
    argv = ["verify", "--arch", KIMI, "--sglang", folder]
    assert main(argv + ["--json", str(out_json), "--md", str(out_md)]) == 0
    assert "patchable" in capsys.readouterr().out
    assert out_json.is_file() and "| verdict | patchable |" in out_md.read_text()
    assert main(argv + ["--strict"]) == 1
    assert main(["verify", "--arch", "NoSuchForCausalLM", "--sglang", folder]) == 1


# -- source location and fetching, without the network -------------------------------------


def test_installed_missing_says_how_to_pass_a_source(monkeypatch):
    monkeypatch.setattr(source_mod.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(VerifyError, match="pip:VERSION"):
        locate("installed")


def test_folder_forms(releases, tmp_path):
    src = releases["0.5.12"]
    assert locate(str(src.root)).package == src.package
    assert locate(str(src.package)).package == src.package
    with pytest.raises(VerifyError, match="holds no sglang package"):
        locate(str(tmp_path))
    with pytest.raises(VerifyError, match="does not exist"):
        locate(str(tmp_path / "nope"))


def test_failed_download_leaves_no_cache_entry(monkeypatch, tmp_path):
    def failing(version, dest, extra):
        return subprocess.CompletedProcess([], 1, "", "ERROR: No matching distribution")

    monkeypatch.setattr(source_mod, "_pip_download", failing)
    with pytest.raises(VerifyError, match="could not download sglang==9.9.9"):
        source_mod.fetch_release("9.9.9", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_cached_release_is_not_downloaded_again(monkeypatch, releases):
    src = releases["0.5.9"]
    monkeypatch.setattr(source_mod, "_pip_download", lambda *a: pytest.fail("downloaded again"))
    again = source_mod.fetch_release("0.5.9", src.root.parent)
    assert again.root == src.root


def test_bad_version_text():
    with pytest.raises(VerifyError, match="not a release number"):
        locate("pip:0.5; rm")


# -- resolution corner cases on a small synthetic tree -----------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in {"sglang/__init__.py": "", "sglang/srt/__init__.py": "",
                      "sglang/srt/models/__init__.py": "", **files}.items():  # fmt: skip
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


CAUSAL = """
    from torch import nn
    class InnerModel(nn.Module):
        def __init__(self):
            self.layers_to_capture = []
        def forward(self, x):
            return [h for i, h in enumerate(x) if i in self.layers_to_capture]
    class InnerForCausalLM(nn.Module):
        def __init__(self, config):
            self.model = InnerModel()
            self.capture_aux_hidden_states = False
        def forward(self, x):
            if self.capture_aux_hidden_states:
                h, aux = self.model(x)
        def set_eagle3_layers_to_capture(self, layer_ids=None):
            self.capture_aux_hidden_states = True
            self.model.layers_to_capture = [v + 1 for v in layer_ids]
    EntryClass = InnerForCausalLM
"""


def test_synthetic_aliases_conditionals_and_unresolved(tmp_path):
    root = _tree(
        tmp_path,
        {
            "sglang/srt/models/inner.py": CAUSAL,
            "sglang/srt/models/wrap.py": """
                from torch import nn
                from .inner import InnerForCausalLM as LM
                from sglang.srt.registry_helpers import pick_class
                Alias = LM
                class Wrapped(nn.Module):
                    def __init__(self, config, lm_cls=Alias):
                        if config.text:
                            self.language_model = lm_cls(config)
                        else:
                            self.language_model = None
                    def set_eagle3_layers_to_capture(self, layer_ids=None):
                        if hasattr(self.language_model, "set_eagle3_layers_to_capture"):
                            self.language_model.set_eagle3_layers_to_capture(layer_ids)
                class Holder(nn.Module):
                    def __init__(self, config):
                        self.llm = Alias(config)
                class Dynamic(nn.Module):
                    def __init__(self, config):
                        self.model = pick_class(config)(config)
                    def set_eagle3_layers_to_capture(self, layer_ids=None):
                        self.model.set_eagle3_layers_to_capture(layer_ids)
                EntryClass = [Wrapped, Holder, Dynamic]
            """,
        },
    )
    an = ChainAnalyzer(SourceIndex(root))
    entries = entry_classes(an.index)
    facts = release_facts(an.index, "test")
    assert set(entries) == {"InnerForCausalLM", "Wrapped", "Holder", "Dynamic"}
    wrapped = verify_arch(an, facts, entries, "Wrapped")
    assert wrapped["verdict"] == "ok", wrapped["why"]
    assert wrapped["delegation"]["to"] == ["model.language_model"]
    holder = verify_arch(an, facts, entries, "Holder")
    assert holder["verdict"] == "patchable" and holder["patch"]["call_on"] == "model.llm"
    dynamic = verify_arch(an, facts, entries, "Dynamic")
    assert dynamic["verdict"] == "unsupported"
    assert "cannot be resolved" in dynamic["why"]
    assert any("pick_class" in u for u in dynamic["unresolved"])


def test_synthetic_hasattr_skip_to_a_model_without_capture(tmp_path):
    root = _tree(
        tmp_path,
        {
            "sglang/srt/models/plain.py": """
                from torch import nn
                class PlainForCausalLM(nn.Module):
                    def forward(self, x):
                        return x
                class Vlm(nn.Module):
                    def __init__(self, config):
                        self.language_model = PlainForCausalLM()
                    def set_eagle3_layers_to_capture(self, layer_ids=None):
                        if hasattr(self.language_model, "set_eagle3_layers_to_capture"):
                            self.language_model.set_eagle3_layers_to_capture(layer_ids)
                EntryClass = [Vlm]
            """,
        },
    )
    an = ChainAnalyzer(SourceIndex(root))
    res = verify_arch(an, release_facts(an.index, "t"), entry_classes(an.index), "Vlm")
    assert res["verdict"] == "unsupported"
    assert "only to classes that lack it" in res["why"]
