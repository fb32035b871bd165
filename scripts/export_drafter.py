"""Snakemake adapter for rule export_drafter: write one engine's folder, then check it again
against expectations taken from the store and the target, not from the drafter's own record."""

import json
import shutil
from pathlib import Path

from safetensors.torch import load_file

from eyrie.common.adapter import rule_log
from eyrie.common.atomic import write_json
from eyrie.common.hf_config import text_config
from eyrie.export import dflash
from eyrie.export.check import Expectation, check_export, served_layers
from eyrie.export.drafter import export, target_embedding
from eyrie.store.shard import ShardReader
from eyrie.train.vocab import load as load_vocab

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive
engine, ex = sm.wildcards.engine, dict(sm.params.export)
target_dir = Path(sm.input.target).parent


def eagle3_problems(record: dict, text: dict, captured: list, tokens) -> tuple[dict, list]:
    """The EAGLE-3 folder against the store's layers, the draft vocabulary and the target."""
    embed = None
    if engine != "sglang":
        embed = target_embedding(target_dir, int(text["vocab_size"]), int(text["hidden_size"]))
    expect = Expectation.of_target(
        engine,
        captured,
        text,
        sglang_rule=ex["sglang_layer_id_rule"],
        draft_tokens=tokens,
        reference=load_file(sm.input.weights),
        target_embedding=embed,
    )
    problems = check_export(sm.output.folder, expect)
    ids = record["config_layer_ids"]
    report = {
        "served_layers": served_layers(ids, engine, ex["sglang_layer_id_rule"]),
        "sglang_layer_id_rule": ex["sglang_layer_id_rule"] if engine == "sglang" else None,
    }
    return report, problems


def dflash_problems(text: dict, captured: list) -> tuple[dict, list]:
    """The DFlash folder against the store's layers and the target's depth."""
    meta = json.loads(Path(sm.input.meta).read_text())
    meta.update(aux_layer_ids=captured, target={"num_hidden_layers": text["num_hidden_layers"]})
    return {"method": "dflash"}, dflash.problems(
        sm.output.folder, meta, load_file(sm.input.weights)
    )


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
        target_dir=target_dir,
        verifier=ex["verifier_name"],
    )
    text = text_config(json.loads(Path(sm.input.target).read_text()))
    captured = ShardReader(sm.input.store).aux_layer_ids  # what extraction really captured
    if record.get("method") == "dflash":
        extra, problems = dflash_problems(text, captured)
    else:
        extra, problems = eagle3_problems(record, text, captured, tokens)
    report = {
        "engine": engine,
        "ok": not problems,
        "problems": problems,
        "captured_aux_layer_ids": captured,
        "config_layer_ids": record["config_layer_ids"],
        **extra,
    }
    print(json.dumps(report, indent=1))
if problems:
    shutil.rmtree(sm.output.folder, ignore_errors=True)
    raise SystemExit(f"error: {sm.output.folder} refused: " + "; ".join(problems))
write_json(sm.output.check, report)
