"""The report from small synthetic inputs: the files, the figures and the verdict line."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from eyrie.evaluate.report import FIGURES, build_report, read_inputs, verdict

ROOT = Path(__file__).resolve().parents[1]
ACCEPTANCE = {
    "steps": 3,
    "samples": 10,
    "full_chains": 500,
    "scored": [600, 580, 560],
    "acc": [0.78, 0.61, 0.5],
    "cond_acc": [0.8, 0.66, 0.55],
    "chain": [0.8, 0.528, 0.2904],
    "reachable": [0.97, 0.97, 0.96],
    "tau": 1.6184,
    "tau_with_bonus": 2.6184,
    "tau_by_draft_tokens": [0.8, 1.328, 1.6184],
}


def speculate(speedup: float) -> dict:
    return {
        "draft_tokens": 3,
        "prompts": 4,
        "identical": 4,
        "device": "cpu",
        "dtype": "float32",
        "plain_tokens_per_s": 100.0,
        "spec_tokens_per_s": 100.0 * speedup,
        "speedup": speedup,
        "accept_length": 2.4,
        "accept_histogram": [10, 5, 3, 7],
        "machine": {"cpu": "Test CPU", "gpu": None},
    }


@pytest.fixture
def files(tmp_path):
    ev = tmp_path / "evaluate"
    ev.mkdir()
    (ev / "acceptance.json").write_text(json.dumps(ACCEPTANCE))
    (ev / "online.json").write_text(json.dumps({"status": "not run", "reason": "no CUDA GPU"}))
    steps = range(1, 21)
    pd.DataFrame(
        {
            "step": steps,
            "epoch": [0] * 20,
            "lr": [1e-3] * 20,
            "loss": [5 - 0.2 * s for s in steps],
            "loss_0": [2 - 0.05 * s for s in steps],
            "loss_1": [2.5 - 0.05 * s for s in steps],
            "acc_0": [0.03 * s for s in steps],
            "acc_1": [0.02 * s for s in steps],
        }
    ).to_csv(tmp_path / "metrics.csv", index=False)
    pd.DataFrame(
        {
            "split": ["heldout", "train", "train", "all"],
            "shard": ["000", "000", "001", "all"],
            "samples": [5, 10, 11, 26],
            "tokens": [900, 2000, 2100, 5000],
            "bytes_stored": [3e6, 7e6, 7.5e6, 17.5e6],
            "errors": [0, 1, 2, 3],
        }
    ).to_csv(tmp_path / "summary.csv", index=False)
    return tmp_path


def write(files, speedup, online=None):
    ev = files / "evaluate"
    (ev / "speculate.json").write_text(json.dumps(speculate(speedup)))
    if online:
        (ev / "online.json").write_text(json.dumps(online))
    inp = read_inputs(ev / "acceptance.json", ev / "speculate.json", ev / "online.json",
                      files / "metrics.csv", files / "summary.csv")  # fmt: skip
    return inp, build_report(inp, files / "report")


def test_the_lines_under_the_verdict_give_the_decoding_walk_and_explain_each_number(files):
    ev = files / "evaluate"
    acc = {**ACCEPTANCE, "walk_accept_length_by_draft_tokens": [1.5, 1.8, 2.05]}
    (ev / "acceptance.json").write_text(json.dumps(acc))
    inp, written = write(files, 1.93)
    summary = written["summary"].read_text()
    lines = summary.splitlines()
    assert lines[0] == verdict(inp) and lines[1] == ""
    under = lines[2 : lines.index("# Eyrie run report")]
    assert under[0].startswith("- acc_0 78 %: how often the drafter's first draft token is")
    assert under[1].startswith("- acc_1|0 66 %: how often its second draft token is")
    assert under[2].startswith("- decoding walk 2.05 tokens/verify step for a chain of 3 drafts:")
    assert under[3].startswith("- τ+1 2.62 for a chain of 3 drafts: the tokens per verify step")
    for term in ("acc_0", "acc_1|0", "decoding walk", "τ+1"):  # each explained once, up there
        assert sum(line.startswith(f"- {term} ") for line in lines) == 1, term
        assert term not in lines[0]
    assert "| 2 |" in summary and "| 2.05 |" in summary


def test_report_files_and_verdict(files):
    inp, written = write(files, 1.93)
    assert set(written) == {"summary", "landing", *FIGURES}
    for name in FIGURES:
        data = written[name].read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, name
    summary = written["summary"].read_text()
    first = summary.splitlines()[0]
    assert first == verdict(inp)
    assert first == (
        "speculation 1.93× faster than plain decoding (transformers loop, 3 draft tokens, cpu: "
        "Test CPU; 2.40 tokens/verify step); 3 extraction errors"
    )
    assert "- acc_0 78 %: " in summary and "- acc_1|0 66 %: " in summary
    assert "- τ+1 2.62 for a chain of 3 drafts: " in summary  # offline, at the measured 3 drafts
    assert "SLOWER" not in summary
    assert "SGLang online: not run: no CUDA GPU" in summary
    assert "| 1 | 61 % | 66 % | 53 % |" in summary  # the per-position table


def test_slower_speculation_is_the_loud_first_line(files):
    inp, written = write(files, 0.66)
    first = written["summary"].read_text().splitlines()[0]
    assert first.startswith("**SPECULATION IS SLOWER THAN PLAIN DECODING: 0.66×** (transformers")


def test_interleaved_repeats_give_the_median_and_spread_in_the_first_line(files):
    ev = files / "evaluate"
    rec = dict(speculate(0.73), repeats=3, timing="interleaved", speedup_min=0.70,
               speedup_max=0.76, speedup_repeats=[0.70, 0.73, 0.76])  # fmt: skip
    (ev / "speculate.json").write_text(json.dumps(rec))
    inp = read_inputs(ev / "acceptance.json", ev / "speculate.json", ev / "online.json")
    summary = build_report(inp, files / "report")["summary"].read_text()
    first = summary.splitlines()[0]
    assert first == verdict(inp)
    assert first.startswith(
        "**SPECULATION IS SLOWER THAN PLAIN DECODING: 0.73×** (transformers loop, median of 3 "
        "interleaved repeats, 0.70-0.76×, 3 draft tokens, cpu: Test CPU; 2.40 tokens/verify step)"
    )
    assert "**0.73×** (median of 3 interleaved repeats, 0.70-0.76×); accept length 2.40" in summary
    one = dict(rec, repeats=1, speedup_min=0.73, speedup_max=0.73)
    assert "(transformers loop, one interleaved pass, 3 draft tokens" in verdict(
        read_inputs_of(one)
    )
    fast = dict(rec, speedup=1.12, speedup_min=1.05, speedup_max=1.2)
    assert verdict(read_inputs_of(fast)).startswith(
        "speculation 1.12× faster than plain decoding (transformers loop, median of 3 interleaved "
        "repeats, "
        "1.05-1.20×, 3 draft tokens"
    )


def read_inputs_of(speculate_record):
    from eyrie.evaluate.report import Inputs

    return Inputs(acceptance=ACCEPTANCE, speculate=speculate_record)


def test_sglang_measurement_wins_when_it_ran(files):
    online = {"status": "ok", "draft_tokens": 3, "prompts": 4, "identical": 4,
              "plain_tokens_per_s": 300.0, "spec_tokens_per_s": 630.0, "speedup": 2.1,
              "accept_length": 3.1}  # fmt: skip
    inp, written = write(files, 0.9, online)
    first = written["summary"].read_text().splitlines()[0]
    assert first.startswith("speculation 2.10× faster than plain decoding (SGLang EAGLE-3")


def test_both_cuda_graph_modes_are_reported_each_by_name(files):
    def mode(plain, spec, same):
        return {"draft_tokens": 3, "prompts": 16, "identical": same, "accept_length": 2.5,
                "plain_tokens_per_s": plain, "spec_tokens_per_s": spec,
                "speedup": spec / plain}  # fmt: skip

    modes = {"cuda_graph": mode(956.0, 410.0, 8), "eager": mode(157.0, 123.0, 9)}
    online = {"status": "ok", **modes["cuda_graph"], "mode": "cuda_graph", "modes": modes}
    inp, written = write(files, 0.9, online)
    summary = written["summary"].read_text()
    assert summary.splitlines()[0].startswith(
        "**SPECULATION IS SLOWER THAN PLAIN DECODING: 0.43×** (SGLang EAGLE-3, 3 draft tokens, "
        "CUDA graphs"
    )
    assert (
        "SGLang online (CUDA graphs, 3 draft tokens): plain 956.0 tok/s, EAGLE-3 410.0 tok/s"
        in summary
    )
    assert "identical outputs 8/16" in summary
    assert (
        "SGLang online (eager, --disable-cuda-graph, 3 draft tokens): plain 157.0 tok/s" in summary
    )
    assert "identical outputs 9/16" in summary


def test_each_served_setting_is_reported_and_the_fastest_is_the_verdict(files):
    def setting(k, topk, verify, spec, accept):
        return {"setting": f"{k}-{topk}-{verify}", "draft_tokens": k, "topk": topk,
                "verify_tokens": verify, "spec_tokens_per_s": spec, "speedup": spec / 400.0,
                "accept_length": accept, "identical": 80}  # fmt: skip

    settings = [setting(3, 1, 4, 480.0, 2.6), setting(7, 1, 8, 560.0, 3.1),
                setting(7, 4, 16, 520.0, 3.4)]  # fmt: skip
    online = {"status": "ok", **settings[0], "prompts": 80, "turns": 160, "mode": "cuda_graph",
              "plain_tokens_per_s": 400.0, "settings": settings}  # fmt: skip
    inp, written = write(files, 0.9, online)
    summary = written["summary"].read_text()
    assert summary.splitlines()[0].startswith(
        "speculation 1.40× faster than plain decoding (SGLang EAGLE-3, 7 draft tokens"
    )
    for shape, spec, ratio in (("3 draft tokens", "480.0", "1.20"), ("7 draft tokens", "560.0",
                               "1.40"), ("a tree of 7 steps × top-4, 16 tokens verified",
                               "520.0", "1.30")):  # fmt: skip
        assert (f"SGLang online (CUDA graphs, {shape}): plain 400.0 tok/s, EAGLE-3 {spec} tok/s, "
                f"**{ratio}×**") in summary  # fmt: skip
    assert "identical outputs 80/80 (160 turns)" in summary


def test_a_served_dflash_drafter_is_named_dflash_not_eagle3(files):
    # the record evaluate_sglang writes for a DFlash export (H100 run of 2026-12-05)
    online = {"status": "ok", "setting": "15-1-16", "draft_tokens": 15, "topk": 1,
              "verify_tokens": 16, "algorithm": "DFLASH", "spec_tokens_per_s": 248.8,
              "plain_tokens_per_s": 830.6, "speedup": 248.8 / 830.6, "accept_length": 1.15,
              "identical": 1, "prompts": 24, "turns": 48, "mode": "cuda_graph"}  # fmt: skip
    inp, written = write(files, 0.9, online)
    summary = written["summary"].read_text()
    assert summary.splitlines()[0].startswith(
        "**SPECULATION IS SLOWER THAN PLAIN DECODING: 0.30×** (SGLang DFlash, 15 draft tokens"
    )
    assert "plain 830.6 tok/s, DFlash 248.8 tok/s" in summary
    assert "EAGLE-3" not in summary
    assert "SGLang DFlash 15-1-16, CUDA graphs" in written["landing"].read_text()


def test_a_served_chain_stands_beside_the_offline_walk_and_a_gap_is_flagged(files):
    ev = files / "evaluate"
    acc = {**ACCEPTANCE, "walk_accept_length_by_draft_tokens": [1.33, 1.41, 1.43]}
    (ev / "acceptance.json").write_text(json.dumps(acc))

    def served(length, k=3, topk=1):
        return {"status": "ok", "draft_tokens": k, "topk": topk, "verify_tokens": 16,
                "accept_length": length, "spec_tokens_per_s": 432.6, "speedup": 0.52,
                "plain_tokens_per_s": 831.4, "identical": 3, "prompts": 24,
                "mode": "cuda_graph"}  # fmt: skip

    summary = write(files, 0.9, served(1.389))[1]["summary"].read_text()
    assert "spec_accept_length 1.39 (offline walk 1.43, served -0.04); identical" in summary
    assert "apart" not in summary
    summary = write(files, 0.9, served(1.60))[1]["summary"].read_text()
    assert "(offline walk 1.43, served +0.17) **more than 0.1 apart" in summary
    # a tree has no offline walk to stand beside; nor has a chain longer than the walk's
    for rec in (served(1.72, k=3, topk=4), served(1.40, k=7)):
        summary = write(files, 0.9, rec)[1]["summary"].read_text()
        assert "offline walk 1" not in summary.split("## Speculative decoding")[1]


def test_missing_inputs_still_give_a_report(tmp_path):
    inp = read_inputs(tmp_path / "none.json", None, None, None, None)
    written = build_report(inp, tmp_path / "r")
    first = written["summary"].read_text().splitlines()[0]
    assert "speed not measured" in first and "extraction errors unknown" in first
    assert all(p.is_file() for p in written.values())


def test_baselines_stand_beside_acc0(tmp_path):
    from eyrie.evaluate.report import Inputs, summary_markdown

    base = {"scored_heldout": 600, "bigram_acc": 0.27, "probe": {"acc": 0.42, "epochs": 1}}
    text = summary_markdown(Inputs(acceptance=ACCEPTANCE, baselines=base))
    assert text.splitlines()[2].startswith("- acc_0 78 % (1-epoch probe 42 %, bigram 27 %): ")
    assert "| the drafter, acc_0 | 78 % |" in text
    assert "context lookup" not in text  # a record from before the lookup baseline
    base["lookup_acc"], base["lookup_max_n"] = 0.81, 4
    text = summary_markdown(Inputs(acceptance=ACCEPTANCE, baselines=base))
    assert ("| context lookup: the token after the last 4 to 1 tokens' most recent earlier "
            "occurrence in the sample (no training) | 81 % |") in text  # fmt: skip
    assert "**A lookup in the sample's own context beats the drafter:**" in text
    base["lookup_acc"] = 0.40
    text = summary_markdown(Inputs(acceptance=ACCEPTANCE, baselines=base))
    assert "| 40 % |" in text and "beats the drafter" not in text
    assert "| MLP probe per position on [aux_t, embed(x_{t+1})], 1 epoch(s) | 42 % |" in text
    assert "does not beat" not in text
    weak = dict(ACCEPTANCE, acc=[0.3, 0.2, 0.1])
    assert "does not beat a probe" in summary_markdown(Inputs(acceptance=weak, baselines=base))
    assert "Baselines: not measured." in summary_markdown(Inputs(acceptance=ACCEPTANCE))
    assert "context lookup names" not in text  # a record from before the split
    split = dict(ACCEPTANCE, lookup_rows={"share": 0.76, "acc0": 0.41, "acc0_other_rows": 0.2})
    text = summary_markdown(Inputs(acceptance=split, baselines=base))
    assert ("On the 76 % of held-out rows whose greedy token the context lookup names (the "
            "target repeating its context), the drafter's acc_0 is 41 %; on the other rows "
            "20 %") in text  # fmt: skip


# ---------------------------------------------------------------------------------------------
# the HTML report's landing page


class _Record:
    """What report/workflow.rst's Jinja sees of a report file (snakemake.report.FileRecord)."""

    def __init__(self, path):
        self.path, self.target = path, path.name


def render_landing_page(results, config: dict) -> str:
    """report/workflow.rst rendered as `snakemake --report` renders its landing page: Jinja
    (snakemake.report.auto_report's Environment) with the config and the report's files, then
    docutils' HTML body, from the workflow's folder (the cwd)."""
    from docutils.core import publish_parts
    from jinja2 import Environment

    class Snakemake:
        pass

    Snakemake.config = config
    records = [_Record(p) for p in sorted((results / "report").glob("*.md"))]
    text = (ROOT / "report" / "workflow.rst").read_text()
    rst = Environment(trim_blocks=True, lstrip_blocks=True).from_string(text)
    rst = rst.render(snakemake=Snakemake, categories={}, files=records)
    return publish_parts(rst, writer="html")["html_body"]


def test_the_html_reports_landing_page_shows_verdict_acceptance_and_speed(files, monkeypatch):
    import html

    monkeypatch.chdir(files)  # Snakemake renders it from the workflow's folder
    results = files / "results"
    ev = files / "evaluate"
    (ev / "speculate.json").write_text(json.dumps(speculate(1.93)))
    inp = read_inputs(ev / "acceptance.json", ev / "speculate.json", ev / "online.json",
                      files / "metrics.csv", files / "summary.csv")  # fmt: skip
    build_report(inp, results / "report")
    config = {"results": "results", "target": {"path": "t"}, "capture": {"backend": "hf"}}
    page = render_landing_page(results, config)
    assert html.escape(verdict(inp), quote=False) in page  # the verdict, no click needed
    assert 'src="data:image/png;base64,' in page  # the acceptance per position
    assert "System Message" not in page  # docutils took the page as it is
    assert "<th>speed-up</th>" in page and "<td>1.93×</td>" in page  # the speed-up table
    assert page.index("faster than plain decoding") < page.index("Eyrie turned the target")


def test_the_landing_page_says_when_the_run_has_no_summary_yet(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = {"results": "results", "target": {"path": "t"}, "capture": {"backend": "hf"}}
    page = render_landing_page(tmp_path / "results", config)
    assert "has not written its summary yet" in page


# ---------------------------------------------------------------------------------------------
# skipped dataset lines at the run's end


def problems_tables(results):
    """A run's prepared splits: train with 3 bad lines and a blank one, heldout clean."""
    data = results / "data"
    data.mkdir(parents=True)
    rows = [
        ["in.jsonl", 2, "malformed_json", "invalid JSON", ""],
        ["in.jsonl", 5, "bad_content", "turn 0 ...", "a"],
        ["in.jsonl", 7, "malformed_json", "invalid JSON", ""],
        ["in.jsonl", 9, "blank_line", "blank line (harmless)", ""],
    ]
    cols = ["path", "line", "kind", "reason", "sample_id"]
    pd.DataFrame(rows, columns=cols).to_csv(data / "train.problems.csv", index=False)
    pd.DataFrame([], columns=cols).to_csv(data / "heldout.problems.csv", index=False)
    (data / "train.jsonl").write_text('{"id": 1}\n' * 6)
    (data / "heldout.jsonl").write_text('{"id": 1}\n' * 4)
    return [data / "train.problems.csv", data / "heldout.problems.csv"]


def test_skipped_dataset_lines_are_in_the_summary_and_the_console_at_the_end(files):
    from eyrie.evaluate.report import run_end_text

    results = files / "results"
    tables = problems_tables(results)
    ev = files / "evaluate"
    (ev / "speculate.json").write_text(json.dumps(speculate(1.5)))
    inp = read_inputs(ev / "acceptance.json", ev / "speculate.json", problems=tables)
    summary = build_report(inp, results / "report")["summary"].read_text()
    train = (
        "train: 3 bad lines skipped (bad_content 1, malformed_json 2), 1 blank line, 6 "
        f"conversations kept; each with its fix in {tables[0]}"
    )
    heldout = f"heldout: 0 bad lines skipped, 4 conversations kept ({tables[1]})"
    head = summary.split("# Eyrie run report")[0]
    assert f"- {train}" in head and f"- {heldout}" in head
    assert summary.splitlines()[0].endswith("; 3 bad dataset lines skipped (listed below)")
    console = run_end_text(results)
    assert f"({results / 'report' / 'summary.md'}): {verdict(inp)}" in console
    assert train.replace(str(tables[0]), str(results / "data" / "train.problems.csv")) in console
    assert "heldout: 0 bad lines skipped" in console


def test_a_run_ends_with_each_splits_skipped_lines_on_the_console(tmp_path):
    """The Snakefile's onsuccess, in a real (small) run: prepare_dataset on two splits, one
    with bad lines; the console names each split's count and the table to read."""
    from slurm.workflow import Workflow

    good = (ROOT / "data" / "chat" / "train.jsonl").read_text().splitlines()[:5]
    # the last: nothing to learn from, and nothing to answer (a user turn would be a prompt)
    lines = good[:2] + ["{not json", "", '{"messages": [{"role": "system", "content": "hi"}]}']
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "train.jsonl").write_text("\n".join(lines + good[2:]) + "\n")
    (tmp_path / "in" / "heldout.jsonl").write_text("\n".join(good) + "\n")
    wf = Workflow.scratch(tmp_path / "wd", {
        "target": {"path": "models/toy-llama"},
        "dataset": {"train": str(tmp_path / "in" / "train.jsonl"),
                    "heldout": str(tmp_path / "in" / "heldout.jsonl")},
    })  # fmt: skip
    log = wf.run("results/data/train.problems.csv", "results/data/heldout.problems.csv")
    assert "Eyrie dataset lines skipped (rule prepare_dataset):" in log
    assert (
        "train: 2 bad lines skipped (malformed_json 1, no_assistant_turn 1), 1 blank line, 5 "
        "conversations kept; each with its fix in results/data/train.problems.csv"
    ) in log
    assert "heldout: 0 bad lines skipped, 5 conversations kept" in log
