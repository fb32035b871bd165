"""A real single-node SLURM (munged, slurmctld, slurmd) in one folder, for tests and trials.

Everything lives under the folder: config, munge key and socket, state, spool, logs and the job
completion log (`jobcomp.log`, one line per finished job), so no accounting database is needed.
Two things cannot live there: the job step of snakemake's SLURM plugin drops every SLURM_*
variable (SLURM_CONF included) before its inner `srun`, which then reads /etc/slurm/slurm.conf;
so that path becomes a symlink to the folder's config while the cluster runs, and only where no
slurm.conf is installed. The daemons run in the foreground as children of this process; stop()
ends exactly those PIDs.

    python tests/slurm/cluster.py start DIR    # prints the SLURM_CONF to export
    python tests/slurm/cluster.py stop DIR
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "sinfo", "scontrol", "scancel", "munge")
SYSTEM_CONF = Path("/etc/slurm/slurm.conf")
NODE = "localhost"
PARTITIONS = ("debug", "gpu")  # tests/ci-slurm.yaml names these
NODE_CPUS = 8  # declared, not real: SlurmdParameters=config_overrides lets the node claim them
NODE_MEM_MB = 16000
FAKE_GPUS = ("/dev/null", "/dev/zero")  # a GPU gres needs one file per device

SLURM_CONF = """\
ClusterName=eyrie-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge/munge.sock
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=600
SchedulerParameters=sched_interval=2
MpiDefault=none
MailProg=/bin/true
GresTypes=gpu
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={root}/jobcomp.log
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={mem} Gres=gpu:fake:{ngpus} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes={node} MaxTime=INFINITE State=UP
"""

GRES_CONF = "NodeName={node} Name=gpu Type=fake File={files}\n"


class ClusterError(RuntimeError):
    """The cluster could not start; the message carries the daemon's log tail."""


def unavailable_reason() -> str | None:
    """Why a test cluster cannot run here, or None when it can."""
    missing = [b for b in DAEMONS + CLIENTS + ("unmunge",) if shutil.which(b) is None]
    if missing:
        return (
            f"SLURM binaries missing: {', '.join(missing)} "
            "(apt-get install slurmctld slurmd slurm-client munge)"
        )
    if os.geteuid() != 0:
        return "a test SLURM runs its daemons as root"
    if SYSTEM_CONF.is_symlink() and _is_ours(SYSTEM_CONF):
        if _link_is_live():
            return f"another test cluster is running ({SYSTEM_CONF} -> {os.readlink(SYSTEM_CONF)})"
    elif SYSTEM_CONF.exists() or SYSTEM_CONF.is_symlink():
        return f"{SYSTEM_CONF} exists: a configured SLURM is installed; not touching it"
    return None


def _is_ours(path: Path) -> bool:
    """A symlink this module made (one left behind by a crash counts too)."""
    return path.is_symlink() and "eyrie-slurm-" in os.readlink(path)


def _link_is_live() -> bool:
    """Whether the cluster that made the /etc link still runs (else the link is stale)."""
    root = Path(os.readlink(SYSTEM_CONF)).parent
    try:
        pids = json.loads((root / "pids.json").read_text())
    except (OSError, ValueError):
        return False
    return any(alive(pid, root) for pid in pids.values())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} not written)"


@dataclass
class Cluster:
    """One test cluster rooted at `root` (a folder whose name contains "eyrie-slurm-")."""

    root: Path
    pids: dict[str, int] = field(default_factory=dict)
    _procs: dict[str, subprocess.Popen] = field(default_factory=dict, repr=False)
    _linked: bool = False

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def jobcomp(self) -> Path:
        return self.root / "jobcomp.log"

    def env(self) -> dict[str, str]:
        """The environment for SLURM clients (and snakemake) to reach this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _write_config(self) -> None:
        for sub in ("munge", "state", "spool", "log"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        os.chmod(self.root / "munge", 0o755)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        self.conf.write_text(
            SLURM_CONF.format(
                host=socket.gethostname().split(".")[0],
                ctld_port=_free_port(),
                slurmd_port=_free_port(),
                root=self.root,
                node=NODE,
                cpus=NODE_CPUS,
                mem=NODE_MEM_MB,
                ngpus=len(FAKE_GPUS),
            )
        )
        (self.root / "gres.conf").write_text(GRES_CONF.format(node=NODE, files=",".join(FAKE_GPUS)))

    def _spawn(self, name: str, argv: list[str]) -> None:
        out = open(self.root / "log" / f"{name}.out", "wb")  # noqa: SIM115 - the child keeps it
        self._procs[name] = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env(),
            start_new_session=True,  # a Ctrl-C in the terminal reaches stop(), not them
        )
        self.pids[name] = self._procs[name].pid
        (self.root / "pids.json").write_text(json.dumps(self.pids))

    def _wait(self, what: str, check, timeout: float, log: Path) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [n for n, p in self._procs.items() if p.poll() is not None]
            if dead:
                raise ClusterError(f"{dead[0]} exited while waiting for {what}:\n{_tail(log)}")
            if check():
                return
            time.sleep(0.2)
        raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}:\n{_tail(log)}")

    def _run(self, *argv: str, input: bytes | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(argv, env=self.env(), input=input, capture_output=True, timeout=20)

    def start(self, timeout: float = 60) -> Cluster:
        """Write the config, start munged, slurmctld and slurmd, and wait for an idle node."""
        if reason := unavailable_reason():
            raise ClusterError(reason)
        self._write_config()
        sock = self.root / "munge" / "munge.sock"
        m = self.root / "munge"
        self._spawn(
            "munged",
            ["munged", "-F", f"--socket={sock}", f"--key-file={m / 'munge.key'}",
             f"--pid-file={m / 'munged.pid'}", f"--log-file={m / 'munged.log'}",
             f"--seed-file={m / 'munged.seed'}"],
        )  # fmt: skip

        def munge_ok() -> bool:
            cred = self._run("munge", "-n", f"--socket={sock}")
            return cred.returncode == 0 and (
                self._run("unmunge", f"--socket={sock}", input=cred.stdout).returncode == 0
            )

        self._wait("munge", munge_ok, timeout, self.root / "log" / "munged.out")
        if SYSTEM_CONF.is_symlink() and _is_ours(SYSTEM_CONF):
            SYSTEM_CONF.unlink()  # left by a crashed run
        SYSTEM_CONF.parent.mkdir(parents=True, exist_ok=True)
        SYSTEM_CONF.symlink_to(self.conf)
        self._linked = True
        self._spawn("slurmctld", ["slurmctld", "-D", "-c", "-f", str(self.conf)])
        self._spawn("slurmd", ["slurmd", "-D", "-N", NODE, "-f", str(self.conf)])

        def node_idle() -> bool:
            out = self._run("sinfo", "-h", "-N", "-o", "%T")
            return out.returncode == 0 and out.stdout.decode().split() == ["idle"] * len(PARTITIONS)

        self._wait("an idle node", node_idle, timeout, self.root / "log" / "slurmctld.log")
        return self

    def stop(self, timeout: float = 15) -> list[int]:
        """Cancel what is left, then end exactly the daemons started here; returns their PIDs."""
        if self.pids.get("slurmctld") and alive(self.pids["slurmctld"], self.root):
            self._run("scancel", f"--user={os.geteuid()}")
        stopped = []
        for name in reversed(DAEMONS):
            pid = self.pids.get(name)
            if pid is None or not alive(pid, self.root):
                continue
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while alive(pid, self.root) and time.monotonic() < deadline:
                self._reap(name)
                time.sleep(0.1)
            if alive(pid, self.root):
                os.kill(pid, signal.SIGKILL)
            self._reap(name, block=True)
            stopped.append(pid)
        if (self._linked or _is_ours(SYSTEM_CONF)) and SYSTEM_CONF.is_symlink():
            if os.readlink(SYSTEM_CONF) == str(self.conf):
                SYSTEM_CONF.unlink()
        return stopped

    def _reap(self, name: str, block: bool = False) -> None:
        proc = self._procs.get(name)
        if proc is not None:
            proc.wait(timeout=10) if block else proc.poll()

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @classmethod
    def attach(cls, root: Path) -> Cluster:
        """The cluster a `start` command left running in root (for `stop`)."""
        pids = json.loads((root / "pids.json").read_text())
        return cls(root=root, pids=pids)

    def completed_jobs(self) -> list[dict[str, str]]:
        """The job completion log as dicts (JobId, Name, JobState, Partition, Tres, ...)."""
        return parse_jobcomp(self.jobcomp.read_text() if self.jobcomp.exists() else "")


def alive(pid: int, root: Path) -> bool:
    """True while pid is a running process started for this root (PIDs can be reused)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    zombie = stat.rsplit(")", 1)[-1].split()[0] == "Z"
    return not zombie and str(root) in cmdline


def parse_jobcomp(text: str) -> list[dict[str, str]]:
    """jobcomp/filetxt lines are space-separated Key=Value pairs; values hold no spaces."""
    jobs = []
    for line in text.splitlines():
        pairs = re.findall(r"(\w+)=(\S*)", line)
        if pairs:
            jobs.append(dict(pairs))
    return jobs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("start", "stop"))
    parser.add_argument("dir", type=Path, help='a folder whose name contains "eyrie-slurm-"')
    args = parser.parse_args(argv)
    root = args.dir.resolve()
    if "eyrie-slurm-" not in str(root):
        parser.error('the folder name must contain "eyrie-slurm-" (so stale links are known)')
    if args.action == "start":
        cluster = Cluster(root)
        try:
            cluster.start()
        except ClusterError as exc:
            cluster.stop()
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"export SLURM_CONF={cluster.conf}  # daemons: {cluster.pids}")
        return 0
    stopped = Cluster.attach(root).stop()
    print(f"stopped {stopped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
