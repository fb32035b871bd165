"""Start the processes of one single-node DDP job with every socket on one address.

`torchrun --standalone` (and torchrun's c10d rendezvous at any endpoint) listens on all
interfaces (`*:port`), so a training run would open ports to the network. Here the rendezvous
store is a TCPStore served on a socket this launcher binds itself, to 127.0.0.1 unless
train.rdzv_host names another address; the workers join it as clients (as under torchrun's agent
store) and, on loopback, gloo and NCCL are told to use the loopback interface. Each worker gets
the variables torchrun sets (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...); when
one fails, the others are stopped.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
import subprocess
import time
from datetime import timedelta

LOOPBACK = "127.0.0.1"


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def listening_socket(host: str) -> socket.socket:
    """A TCP socket bound to (host, a free port) and listening."""
    infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(addr[:2] if family == socket.AF_INET else addr)
    sock.listen(128)
    return sock


def worker_env(base: dict, rank: int, world: int, host: str, port: int) -> dict:
    env = dict(base)
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        GROUP_RANK="0",
        ROLE_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        ROLE_WORLD_SIZE=str(world),
        MASTER_ADDR=host,
        MASTER_PORT=str(port),
        TORCHELASTIC_USE_AGENT_STORE="True",  # join the launcher's store, serve none
        TORCHELASTIC_RESTART_COUNT="0",
        TORCHELASTIC_RUN_ID="eyrie",
    )
    if _is_loopback(host):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        env.setdefault("NCCL_SOCKET_IFNAME", "lo")
    return env


def launch(
    cmd: list[str],
    processes: int,
    *,
    host: str | None = None,
    env: dict | None = None,
    stdout=None,
    stderr=None,
    timeout: timedelta = timedelta(minutes=30),
) -> int:
    """Run `cmd` as `processes` DDP workers; the first non-zero exit code, or 0."""
    import torch.distributed as dist

    host = host or LOOPBACK
    sock = listening_socket(host)
    port = sock.getsockname()[1]
    store = dist.TCPStore(
        host,
        port,
        world_size=processes,
        is_master=True,
        timeout=timeout,
        wait_for_workers=False,
        master_listen_fd=sock.fileno(),
    )
    sock.detach()  # the store owns the socket now
    base = dict(os.environ if env is None else env)
    procs = [
        subprocess.Popen(cmd, env=worker_env(base, r, processes, host, port), stdout=stdout,
                         stderr=stderr)
        for r in range(processes)
    ]  # fmt: skip
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [c for c in codes if c not in (None, 0)]
            if failed or all(c == 0 for c in codes):
                return failed[0] if failed else 0
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        del store


def main(argv: list[str] | None = None) -> int:
    """`python -m eyrie.train.launch --processes N [--host H] -- CMD...`"""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m eyrie.train.launch")
    parser.add_argument("--processes", type=int, required=True)
    parser.add_argument("--host", default=None, help="rendezvous address (default 127.0.0.1)")
    parser.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd or args.processes < 1:
        parser.error("give --processes N >= 1 and a command after --")
    return launch(cmd, args.processes, host=args.host, stdout=sys.stdout, stderr=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
