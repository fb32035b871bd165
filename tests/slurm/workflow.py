"""Run the workflow in a scratch folder as a user would (locally or through a profile), and read
its dry-run plans.

The scratch folder gets copies of config.yaml, the shipped data and toy-llama, so a run there
neither touches the repository's results/ and .snakemake/ nor depends on their state.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "tests" / "configs"
COPIED = ("config.yaml", "data/chat", "models/toy-llama")


@dataclass
class PlannedJob:
    """One job of a plan (`snakemake -n`), with the reason Snakemake gives for running it."""

    rule: str
    wildcards: dict[str, str]
    reason: str
    local: bool
    output: str = ""
    log: str = ""
    benchmark: str = ""
    threads: int = 1
    resources: dict[str, str] = field(default_factory=dict)

    @property
    def paths(self) -> list[str]:
        """What the job writes: its outputs (files or folders), log and benchmark."""
        text = ", ".join(t for t in (self.output, self.log, self.benchmark) if t)
        return [p for p in text.split(", ") if p]

    def wrote(self, path: str) -> bool:
        """Whether path is one of the job's paths or inside one (a directory() output)."""
        return any(path == p or path.startswith(p.rstrip("/") + "/") for p in self.paths)

    @property
    def key(self) -> tuple:
        return (self.rule, tuple(sorted(self.wildcards.items())))


def parse_plan(text: str) -> list[PlannedJob]:
    """The jobs of a dry-run log: each `rule NAME:` block and its indented key: value lines."""
    jobs: list[PlannedJob] = []
    current: dict | None = None
    for line in text.splitlines():
        head = re.match(r"^(local)?(?:rule|checkpoint) (\w+):$", line)
        if head:
            current = {"local": bool(head.group(1)), "rule": head.group(2)}
            jobs.append(current)  # type: ignore[arg-type]
            continue
        item = re.match(r"^    (\w+): (.*)$", line)
        if current is not None and item:
            current[item.group(1)] = item.group(2)
        elif not line.startswith("    "):
            current = None
    return [
        PlannedJob(
            rule=j["rule"],
            wildcards=_pairs(j.get("wildcards", "")),
            reason=j.get("reason", ""),
            local=j["local"],
            output=j.get("output", ""),
            log=j.get("log", ""),
            benchmark=j.get("benchmark", ""),
            threads=int(j.get("threads", 1)),
            resources=_pairs(j.get("resources", "")),
        )
        for j in jobs
    ]


def _pairs(text: str) -> dict[str, str]:
    return dict(p.split("=", 1) for p in text.split(", ") if "=" in p)


@dataclass
class Workflow:
    """The workflow run from a scratch folder with config files layered over config.yaml."""

    root: Path
    configfiles: list[Path]
    env: dict[str, str] | None = None
    # how Python starts Snakemake: its module, or a script that adjusts it first (fast_poll.py)
    main: tuple[str, ...] = ("-m", "snakemake")

    @classmethod
    def scratch(cls, root: Path, *configs: Path | dict) -> Workflow:
        """A scratch folder with the shipped inputs; dict configs are written there as YAML."""
        root.mkdir(parents=True, exist_ok=True)
        for rel in COPIED:
            src, dst = REPO / rel, root / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(src, dst) if src.is_dir() else shutil.copy2(src, dst)
        files = []
        for i, cfg in enumerate(configs):
            if isinstance(cfg, dict):
                path = root / f"override-{i}.yaml"
                path.write_text(yaml.safe_dump(cfg))
                cfg = path
            files.append(Path(cfg).resolve())
        return cls(root=root.resolve(), configfiles=files)

    def with_config(self, name: str, cfg: dict) -> Workflow:
        """The same folder with one more config layer (written as name.yaml)."""
        path = self.root / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return Workflow(self.root, [*self.configfiles, path], self.env, self.main)

    def command(self, *args: str, profile: str = "local") -> list[str]:
        return [
            sys.executable, *self.main,
            "--snakefile", str(REPO / "Snakefile"),
            "--directory", str(self.root),
            "--profile", str(REPO / "profiles" / profile),
            "--configfile", *map(str, self.configfiles),
            "--nocolor",
            *args,
        ]  # fmt: skip

    def start(self, *args: str, profile: str = "local", log: Path) -> subprocess.Popen:
        """Start a run in its own process group (so it can be killed whole); output to log."""
        out = open(log, "wb")  # noqa: SIM115 - the child keeps it
        return subprocess.Popen(
            self.command(*args, profile=profile),
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=self.root,
            env=self.env,
            start_new_session=True,
        )

    def run(
        self, *args: str, profile: str = "local", timeout: float = 600, check: bool = True
    ) -> str:
        """Run to the end and return the log; on timeout interrupt it (SIGINT cancels cluster
        jobs), then fail."""
        log = self.root / "last-run.log"
        proc = self.start(*args, profile=profile, log=log)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            raise AssertionError(
                f"snakemake ran past {timeout:.0f} s:\n{_tail(log.read_text())}"
            ) from None
        text = log.read_text(errors="replace")
        if check and proc.returncode != 0:
            raise AssertionError(f"snakemake exited {proc.returncode}:\n{_tail(text)}")
        return text

    def plan(self, *args: str, profile: str = "local") -> list[PlannedJob]:
        """The jobs `snakemake -n` would run now, with their reasons."""
        return parse_plan(self.run("-n", *args, profile=profile, timeout=120))

    def pretend_finished(self) -> None:
        """Fake a finished run in seconds: every planned output created empty (folders for
        directory() outputs), then `snakemake --touch` puts their mtimes in the jobs' order."""
        for job in self.plan():
            for out in job.output.split(", ") if job.output else []:
                path = self.path(out)
                path.parent.mkdir(parents=True, exist_ok=True)
                if out.endswith(".zarr") or path.parent.name == "export":
                    path.mkdir(exist_ok=True)
                else:
                    path.touch()
        self.run("--touch", "--cores", "1", timeout=120)

    def summary(self, *args: str) -> dict[str, dict[str, str]]:
        """`snakemake --summary` by output file: date, rule, status (why), plan (what next)."""
        lines = self.run("--summary", *args, timeout=120).splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("output_file\t"))
        header = lines[start].split("\t")
        rows = [line.split("\t") for line in lines[start + 1 :]]
        rows = [dict(zip(header, r, strict=True)) for r in rows if len(r) == len(header)]
        return {row["output_file"]: row for row in rows}

    def path(self, rel: str) -> Path:
        return self.root / rel


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])
