"""How the user started the workflow, so that a command Eyrie prints runs as printed.

A message that says "run this" must carry the user's own options: their --configfile files
(else Snakemake reads config.yaml alone, and a path under another `results` has no rule), their
--config values, and their Snakefile and folder when not the defaults. Inside Snakemake the
workflow records the command in the environment (`RERUN_ENV`, set by rules/common.smk when it
is parsed) for the jobs' scripts to read; a param would rerun a job whenever the config files
were named differently.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path

RERUN_ENV = "EYRIE_SNAKEMAKE_COMMAND"


@dataclass(frozen=True)
class Rerun:
    """How to run the workflow again as the user did.

    `snakemake`: the command up to its targets (program, --snakefile/--directory when not the
    defaults, --configfile, --config). `eyrie_config`: a file that holds the same config whole,
    for `eyrie extract --config`, or None (a Snakemake run's config is layers over config.yaml;
    its own command is then the one to give).
    """

    snakemake: tuple[str, ...] = ("snakemake", "--cores", "1")
    eyrie_config: str | None = "config.yaml"

    @classmethod
    def of_workflow(
        cls,
        configfiles=(),
        config_args=(),
        snakefile: str | Path = "Snakefile",
        workdir: str | Path = ".",
    ) -> Rerun:
        """From what Snakemake was given: workflow.overwrite_configfiles (absolute paths),
        workflow.config_settings.config_args, workflow.main_snakefile and the working folder."""
        workdir = Path(workdir).absolute()
        cmd = ["snakemake", "--cores", "1"]
        moved = Path(snakefile).absolute() != workdir / "Snakefile"
        if moved:  # run from elsewhere: name both, so the command runs from any folder
            cmd += ["--snakefile", str(Path(snakefile).absolute()), "--directory", str(workdir)]
        files = [_shown(Path(f), workdir, moved) for f in configfiles]
        if files:
            cmd += ["--configfile", *files]
        if config_args:
            cmd += ["--config", *map(str, config_args)]
        return cls(tuple(cmd), None)  # the Snakemake command is the one that matches the run

    @classmethod
    def of_config(cls, configfile: str | Path) -> Rerun:
        """For `eyrie validate --config FILE`: that file, whole, for both commands."""
        cmd = ("snakemake", "--cores", "1", "--configfile", str(configfile))
        return cls(cmd, str(configfile))

    @classmethod
    def from_environ(cls) -> Rerun:
        """The command rules/common.smk recorded, or the default one outside Snakemake."""
        text = os.environ.get(RERUN_ENV)
        if not text:
            return cls()
        return cls(tuple(shlex.split(text)), None)

    def local(self, path: str | Path) -> str:
        """A path of the workflow's folder as a shell command beside this one names it: made
        absolute when the command names the folder (--directory), so both run from anywhere."""
        words = list(self.snakemake)
        if "--directory" in words and not Path(path).is_absolute():
            return str(Path(words[words.index("--directory") + 1]) / path)
        return str(path)

    def __str__(self) -> str:
        return shlex.join(self.snakemake)

    def targets(self, *paths: str | Path, options=()) -> str:
        """The Snakemake command for these targets (with more `options`), quoted for a shell.
        `--` ends the options: --configfile and --config take every word after them."""
        return shlex.join([*self.snakemake, *map(str, options), "--", *map(str, paths)])


def _shown(path: Path, workdir: Path, moved: bool) -> str:
    """A config file as the command names it: relative to the working folder when inside it
    and the command runs there, else absolute."""
    if not moved and path.is_relative_to(workdir):
        return str(path.relative_to(workdir))
    return str(path)
