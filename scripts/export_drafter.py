"""Snakemake adapter for rule export_drafter: write one engine's folder, then check it again
against expectations taken from the store and the target, not from the drafter's own record."""

import json
import shutil
from pathlib import Path

from safetensors.torch import load_file

from eyrie.common.adapter import rule_log
from eyrie.common.atomic import write_json
from eyrie.common.hf_config import text_config
from eyrie.export.check import Expectation, check_export, served_layers
from eyrie.export.drafter import export, target_embedding
from eyrie.store.shard import ShardReader
from eyrie.train.vocab import load as load_vocab

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

engine, ex = sm.wildcards.engine, dict(sm.params.export)
with rule_log(sm, threads=False):
    tokens = load_vocab(sm.input.vocab).draft_tokens
    record = export(
        Path(sm.input.weights).parent,
        sm.output.folder,
        engine,
        sglang_rule=ex["sglang_layer_id_rule"],
        dtype=ex["dtype"],
        speculative_tokens=ex["speculative_tokens"],
        draft_tokens=tokens,
        target_dir=Path(sm.input.target).parent,
        verifier=ex["verifier_name"],
    )
    text = text_config(json.loads(Path(sm.input.target).read_text()))
    captured = ShardReader(sm.input.store).aux_layer_ids  # what extraction really captured
    expect = Expectation.of_target(
        engine,
        captured,
        text,
        sglang_rule=ex["sglang_layer_id_rule"],
        draft_tokens=tokens,
        reference=load_file(sm.input.weights),
        target_embedding=None
        if engine == "sglang"
        else target_embedding(
            Path(sm.input.target).parent, int(text["vocab_size"]), int(text["hidden_size"])
        ),
    )
    problems = check_export(sm.output.folder, expect)
    ids = record["config_layer_ids"]
    report = {
        "engine": engine,
        "ok": not problems,
        "problems": problems,
        "captured_aux_layer_ids": captured,
        "config_layer_ids": ids,
        "served_layers": served_layers(ids, engine, ex["sglang_layer_id_rule"]),
        "sglang_layer_id_rule": ex["sglang_layer_id_rule"] if engine == "sglang" else None,
    }
    print(json.dumps(report, indent=1))
if problems:
    shutil.rmtree(sm.output.folder, ignore_errors=True)
    raise SystemExit(f"error: {sm.output.folder} refused: " + "; ".join(problems))
write_json(sm.output.check, report)
