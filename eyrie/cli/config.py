"""`eyrie config`: validate a config file and show it with every default filled in, or print
the config reference (a Markdown table made from the schema, as in the README).

A file other than the workflow's config.yaml is merged over that one first, as
`snakemake --configfile FILE` merges it, so an override file holding only what differs checks
as the run will see it.
"""

from __future__ import annotations

import json
import logging
import sys

import yaml

from eyrie.common.config import (
    WORKFLOW_CONFIG,
    ConfigError,
    allowed_words,
    base_for,
    check,
    load,
    schema,
)


def add_arguments(parser) -> None:
    parser.add_argument("configfile", nargs="?", default=str(WORKFLOW_CONFIG))
    parser.add_argument(
        "--base",
        default=str(WORKFLOW_CONFIG),
        help="the config the file is merged over, as Snakemake merges --configfile over the "
        "Snakefile's configfile (default: config.yaml of this folder, the workflow's)",
    )
    parser.add_argument(
        "--reference", action="store_true", help="print the config reference as Markdown"
    )


def _rows(node: dict, prefix: str = ""):
    for name, sub in node.get("properties", {}).items():
        key = f"{prefix}{name}"
        if sub.get("type") == "object" and "properties" in sub:
            yield from _rows(sub, key + ".")
            continue
        kind = sub.get("type", "")
        kind = " or ".join(kind) if isinstance(kind, list) else kind
        allowed = sub.get("enum")
        if allowed is None and "allowed" not in sub and ("minimum" in sub or "maximum" in sub):
            allowed = f"{sub.get('minimum', '')}..{sub.get('maximum', '')}"
        if allowed is None:
            allowed = allowed_words(sub)
        default = json.dumps(sub["default"]) if "default" in sub else "(required)"
        text = sub.get("description", "")
        yield key, kind, default, "" if allowed is None else str(allowed), text


def reference() -> str:
    lines = ["| key | type | default | allowed | meaning |", "|---|---|---|---|---|"]
    for row in _rows(schema()):
        lines.append(
            "| "
            + " | ".join(f"`{row[0]}`" if i == 0 else row[i].replace("|", "\\|") for i in range(5))
            + " |"
        )
    return "\n".join(lines)


def load_for(command: str, path, base=None) -> dict | None:
    """The config of a subcommand (merged over `base` when given, as Snakemake would), loaded
    with defaults, or None after printing what is wrong (every bad key, as `eyrie config FILE`
    names it) under the subcommand's name."""
    try:
        return load(path, base)
    except ConfigError as exc:
        print(f"eyrie {command}: {exc}", file=sys.stderr)
        return None


def stage_config(args) -> dict:
    """The config of a stage's subcommand (``--config``; a ConfigError reaches eyrie.cli.main),
    with the stage's INFO logging on, and torch's CPU threads set where ``--threads`` is given."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    cfg = load(args.config)
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)
    return cfg


def check_config(config: dict) -> None:
    """For the Snakefile: stop with what `eyrie config FILE` prints (every bad key, with the
    allowed keys or values) when the merged config is bad."""
    try:
        check(config)
    except ConfigError as exc:
        print(f"eyrie: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


def run(args) -> int:
    if args.reference:
        print(reference())
        return 0
    cfg = load_for("config", args.configfile, args.base)
    if cfg is None:
        return 2
    under = base_for(args.configfile, args.base)
    if under is not None:
        print(f"# {args.configfile} merged over {under}, every default filled in")
    yaml.safe_dump(cfg, sys.stdout, sort_keys=False)
    return 0
