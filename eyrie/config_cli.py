"""`eyrie config`: validate a config file and show it with every default filled in."""

from __future__ import annotations

import sys

import yaml

from eyrie.config import ConfigError, load


def add_arguments(parser) -> None:
    parser.add_argument("configfile", nargs="?", default="config.yaml")


def run(args) -> int:
    try:
        cfg = load(args.configfile)
    except ConfigError as exc:
        print(f"eyrie config: {exc}", file=sys.stderr)
        return 2
    yaml.safe_dump(cfg, sys.stdout, sort_keys=False)
    return 0
