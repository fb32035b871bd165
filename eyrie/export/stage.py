"""The export stage's steps, as the workflow's rules and the `eyrie` subcommands run them.

- export_checked: one engine's folder written (eyrie/export/drafter.py; DFlash's in dflash.py),
  then checked again against expectations taken from what extraction captured (a store's aux
  layer ids) and the target folder, not from the drafter's own record; a refused folder is
  removed;
- folder_expectation: what a folder an engine is about to load must serve, from its
  eyrie-export.json or the target, for `eyrie check-export` (eyrie/export/check.py checks it).

The Snakemake adapter in scripts/ and the `eyrie export` and `eyrie check-export` subcommands
call these, so a rule and a subcommand check the same things.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from eyrie.common.atomic import write_json
from eyrie.common.hf_config import text_config
from eyrie.export import dflash
from eyrie.export.check import (
    EXPORT_META,
    Expectation,
    ExportError,
    check_export,
    served_layers,
)
from eyrie.export.drafter import export, target_embedding


def export_checked(
    *,
    drafter_dir,
    out_dir,
    engine: str,
    settings: dict,
    target_dir,
    vocab_path=None,
    store=None,
    check_json=None,
) -> dict:
    """Write ``out_dir`` for ``engine`` from the trained drafter, with the ``export:`` settings;
    check it against the draft vocabulary (``vocab_path``, when given), the target and the aux
    layers ``store`` holds (None: the drafter's own record of them). Returns the check, also
    written to ``check_json`` when given; a refused folder is removed (ExportError)."""
    from safetensors.torch import load_file

    from eyrie.train.vocab import load as load_vocab

    tokens = load_vocab(vocab_path).draft_tokens if vocab_path is not None else None
    record = export(
        drafter_dir,
        out_dir,
        engine,
        sglang_rule=settings["sglang_layer_id_rule"],
        dtype=settings["dtype"],
        speculative_tokens=settings["speculative_tokens"],
        draft_tokens=tokens,
        target_dir=target_dir,
        verifier=settings["verifier_name"],
    )
    text = text_config(json.loads((Path(target_dir) / "config.json").read_text()))
    captured = record["trained_aux_layer_ids"]
    if store is not None:  # what extraction really captured
        from eyrie.store.shard import ShardReader

        captured = ShardReader(store).aux_layer_ids
    reference = load_file(str(Path(drafter_dir) / "model.safetensors"))
    if record.get("method") == "dflash":  # against the store's layers and the target's depth
        meta = json.loads((Path(drafter_dir) / "drafter.json").read_text())
        meta.update(aux_layer_ids=captured, target={"num_hidden_layers": text["num_hidden_layers"]})
        extra, problems = {"method": "dflash"}, dflash.problems(out_dir, meta, reference)
    else:  # against the store's layers, the draft vocabulary and the target
        rule = settings["sglang_layer_id_rule"]
        embed = None
        if engine != "sglang":
            embed = target_embedding(target_dir, int(text["vocab_size"]), int(text["hidden_size"]))
        expect = Expectation.of_target(
            engine,
            captured,
            text,
            sglang_rule=rule,
            draft_tokens=tokens,
            reference=reference,
            target_embedding=embed,
        )
        problems = check_export(out_dir, expect)
        extra = {
            "served_layers": served_layers(record["config_layer_ids"], engine, rule),
            "sglang_layer_id_rule": rule if engine == "sglang" else None,
        }
    report = {
        "engine": engine,
        "ok": not problems,
        "problems": problems,
        "captured_aux_layer_ids": captured,
        "config_layer_ids": record["config_layer_ids"],
        **extra,
    }
    if problems:
        shutil.rmtree(out_dir, ignore_errors=True)
        raise ExportError(f"{out_dir} refused: " + "; ".join(problems))
    if check_json is not None:
        write_json(check_json, report)
    return report


def folder_expectation(
    folder, engine: str, *, target=None, aux_layer_ids=None, sglang_rule=None, drafter=None
) -> Expectation | None:
    """What ``folder`` must serve on ``engine``: the trained layers (``aux_layer_ids``, else the
    ``drafter`` folder's, else eyrie-export.json's), the ``target`` folder's sizes (else the
    record's) and, given them, the drafter's weights and the target's embedding (vLLM). None
    when neither the arguments nor the folder's eyrie-export.json name the layers and the
    target."""
    from eyrie.train.saved import read_drafter

    folder = Path(folder)
    meta_path = folder / EXPORT_META
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    reference, ids = None, aux_layer_ids
    if drafter:
        dmeta, reference = read_drafter(drafter)
        ids = ids or dmeta["aux_layer_ids"]
    ids = ids or meta.get("trained_aux_layer_ids")
    embed = None
    if target:
        text = text_config(json.loads((Path(target) / "config.json").read_text()))
        if engine == "vllm":  # the shipped embedding must be this target's
            embed = target_embedding(target, int(text["vocab_size"]), int(text["hidden_size"]))
    else:
        text = meta.get("target")
    if not ids or not text:
        return None
    return Expectation.of_target(
        engine,
        ids,
        text,
        sglang_rule=sglang_rule or meta.get("sglang_layer_id_rule") or "plus_one",
        reference=reference,
        target_embedding=embed,
    )
