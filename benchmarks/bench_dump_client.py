"""The extraction client's side of the SGLang dump path, alone: how many requests' dumps a
client process takes per second, at Llama-3.1-8B's width, against the rate a server makes them.

On the H200 (benchmarks/RESULTS.md) the patched server's own work fell to a few percent of a
pass, and the client became the limit: 32 request threads in one Python process polling the
dump folder, scanning it for room, reading and checking each request's chunk files. This
replays that traffic without a GPU or a server, so a client can be compared with another one
in the same run:

- this process writes each request's chunk file into a fresh dump folder with the patch's own
  writer (`protocol.save_chunk`), at --rate-gbs (0: all at once), in request order;
- a child process runs the client of this checkout, or of EYRIE_SOURCE=DIR (an earlier
  release), with --threads request threads, each waiting for its request's dump with
  DumpFolder.collect (and SglangCapture._room first) as extraction does, minus the HTTP part;
- printed: the client's requests/s and GB/s of states, its CPU seconds per GB, the mean lag
  from a file landing to its request being collected, and the machine.

    python benchmarks/bench_dump_client.py --requests 512 --threads 32
    EYRIE_SOURCE=/tmp/old python benchmarks/bench_dump_client.py --client-only DIR ...  (inner)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def client(args) -> dict:
    """The child: collect every request of the folder's plan with --threads threads."""
    sys.path.insert(0, os.environ.get("EYRIE_SOURCE") or str(REPO))
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from eyrie.extract.sglang import DumpFolder, SglangCapture

    folder_path = Path(args.client_only)
    plan = json.loads((folder_path.parent / "plan.json").read_text())
    folder = DumpFolder(folder_path, plan["manifest_sha256"], folder_path.parent)
    settings = {"concurrency": args.threads, "request_timeout_s": 600, "dump_timeout_s": 120,
                "max_dump_bytes": 8 << 30, "dtype": "bfloat16"}  # fmt: skip
    cap = SglangCapture("http://127.0.0.1:9", folder, settings, plan["prefix"])
    landed = {}

    def one(item):
        rid, n = item
        ids = np.arange(n, dtype=np.int64) % 1000
        cap._room()
        aux, final = folder.collect(rid, ids, timeout=120)
        landed[rid] = time.time()
        return aux.numel() * 2 + final.numel() * 2

    cpu0, t0 = time.process_time(), time.perf_counter()
    with ThreadPoolExecutor(args.threads) as pool:
        nbytes = sum(pool.map(one, [(r, n) for r, n in plan["requests"]]))
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    cap.close()
    return {"seconds": seconds, "cpu_s": cpu, "bytes": nbytes, "collected_at": landed}


def write_all(folder: Path, plan: dict, rate_gbs: float, hidden: int, k: int) -> dict:
    """The server's side: each request's chunk file, at the given rate; when each landed."""
    import torch

    from eyrie.sglang.patch import protocol as proto

    g = torch.Generator().manual_seed(0)
    pool = torch.randn(4096, k + 1, hidden, generator=g).to(torch.bfloat16)
    landed, t0, sent = {}, time.perf_counter(), 0
    for rid, n in plan["requests"]:
        tensors = {"aux": pool[:n, :k], "final": pool[:n, k],
                   "input_ids": torch.arange(n, dtype=torch.int64) % 1000,
                   "positions": torch.arange(n, dtype=torch.int64)}  # fmt: skip
        tensors = {name: t.contiguous() for name, t in tensors.items()}
        meta = {"rid": rid, "prefix": 0, "tokens": n, "format": proto.FORMAT}
        proto.save_chunk(folder / proto.chunk_name(rid, 0), tensors, meta)
        landed[rid] = time.time()
        sent += n * (k + 1) * hidden * 2
        if rate_gbs > 0:
            ahead = sent / (rate_gbs * 1e9) - (time.perf_counter() - t0)
            if ahead > 0:
                time.sleep(ahead)
    return landed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=512)
    ap.add_argument("--threads", type=int, default=32, help="requests in flight")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--aux", type=int, default=3)
    ap.add_argument("--rate-gbs", type=float, default=0.0, help="the server's rate; 0: at once")
    ap.add_argument("--data", default=str(REPO / "data/chat/train.jsonl"), help="lengths from")
    ap.add_argument("--old", help="also measure the client of this earlier release's folder")
    ap.add_argument("--client-only", help=argparse.SUPPRESS)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if args.client_only:
        print(json.dumps(client(args)))
        return 0
    sys.path.insert(0, str(REPO))
    from eyrie.common.provenance import machine
    from eyrie.sglang.patch import protocol as proto

    lengths = []  # the chat samples' token counts, as the H200 run's (median 84)
    for line in open(args.data, encoding="utf-8"):
        text = " ".join(m["content"] for m in json.loads(line)["messages"])
        lengths.append(min(512, max(25, len(text) // 4)))
        if len(lengths) == args.requests:
            break
    rows = {}
    for name, source in [("this checkout", None), ("earlier", args.old)]:
        if name == "earlier" and not source:
            continue
        work = Path(tempfile.mkdtemp(prefix="bench-dump-", dir="/dev/shm"))
        folder = proto.ensure_private_dir(work / "dump")
        plan = {"prefix": "eyrie-bench:", "manifest_sha256": "0" * 64,
                "requests": [(f"eyrie-bench:r{i}", n) for i, n in enumerate(lengths)]}  # fmt: skip
        (work / "plan.json").write_text(json.dumps(plan))
        env = {**os.environ, "EYRIE_SOURCE": source or str(REPO)}
        cmd = [sys.executable, __file__, "--client-only", str(folder), "--threads",
               str(args.threads)]  # fmt: skip
        child = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
        landed: dict = {}
        writer = threading.Thread(
            target=lambda out, *a: out.update(write_all(*a)),
            args=(landed, folder, plan, args.rate_gbs, args.hidden, args.aux),
        )
        time.sleep(3.0)  # the child imports torch before the first file lands
        writer.start()
        out, _ = child.communicate(timeout=1800)
        writer.join()
        got = json.loads(out.strip().splitlines()[-1])
        collected = got.pop("collected_at")
        lag = [collected[r] - landed[r] for r in collected]
        gb = got["bytes"] / 1e9
        rows[name] = {**got, "requests": len(collected), "requests_per_s": len(collected) /
                      got["seconds"], "gb_per_s": gb / got["seconds"], "cpu_s_per_gb":
                      got["cpu_s"] / gb, "mean_lag_ms": 1000 * sum(lag) / len(lag)}  # fmt: skip
        r = rows[name]
        print(
            f"{name}: {r['requests']} requests, {gb:.2f} GB in {r['seconds']:.2f} s: "
            f"{r['requests_per_s']:.0f} requests/s, {r['gb_per_s']:.2f} GB/s, "
            f"{r['cpu_s_per_gb']:.2f} CPU s/GB, lag {r['mean_lag_ms']:.1f} ms",
            flush=True,
        )
        subprocess.run(["rm", "-rf", str(work)], check=False)
    if "earlier" in rows:
        ratio = rows["this checkout"]["gb_per_s"] / rows["earlier"]["gb_per_s"]
        print(f"this checkout / earlier: {ratio:.2f}x the GB/s")
    m = machine()
    print(f"machine: {m['cpu']}, {m['cpu_cores']} cores, torch {m['torch']}; server rate "
          f"{args.rate_gbs or 'unbounded'} GB/s, {args.threads} request threads")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows, "machine": m}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
