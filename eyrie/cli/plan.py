"""`eyrie plan`: the bill of a run before anything runs (eyrie.plan.bill)."""

from __future__ import annotations

import json
from pathlib import Path

from eyrie.common.config import WORKFLOW_CONFIG, load
from eyrie.plan.bill import PlanError, make_bill, render


def add_arguments(parser) -> None:
    parser.add_argument(
        "--configfile",
        default=str(WORKFLOW_CONFIG),
        help="the run's config, merged over config.yaml as Snakemake does",
    )
    parser.add_argument(
        "--tokens", type=float, required=True, help="tokens to extract (e.g. 17.3e6)"
    )
    parser.add_argument(
        "--hidden", type=int, help="the target's hidden size; default: target.path's config.json"
    )
    parser.add_argument("--extract-tok-s", type=float, help="your server's prefill tokens/s")
    parser.add_argument("--train-tok-s", type=float, help="your trainer's tokens/s on one GPU")
    parser.add_argument("--json", action="store_true", help="print the bill as JSON")


def target_hidden(config: dict) -> int:
    """hidden_size of the configured target's config.json (a text_config's for a wrapper)."""
    path = Path(str(config["target"]["path"])) / "config.json"
    if not path.is_file():
        raise PlanError(
            f"{path} is not there (a pkg: target is fetched by the workflow); give "
            "the target's width with --hidden"
        )
    cfg = json.loads(path.read_text(encoding="utf-8"))
    return int((cfg.get("text_config") or cfg)["hidden_size"])


def run(args) -> int:
    config = load(args.configfile, base=WORKFLOW_CONFIG)
    hidden = args.hidden or target_hidden(config)
    bill = make_bill(
        config,
        hidden=hidden,
        tokens=int(args.tokens),
        extract_tok_s=args.extract_tok_s,
        train_tok_s=args.train_tok_s,
    )
    print(json.dumps(bill.__dict__, indent=1) if args.json else render(bill), end="")
    return 0
