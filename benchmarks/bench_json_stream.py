"""Reading a large JSON array: json.load against eyrie's stream reader and ijson, each in a
process of its own (time, peak resident memory), on a synthetic ShareGPT-like file or a real one.

    python benchmarks/bench_json_stream.py [--file FILE] [--mb 120] [--first 200]

Without --file, a file of about --mb MB is written to a temporary folder (indent 2, as ShareGPT
ships, mixed ASCII and other text). ijson is measured when it imports (PYTHONPATH may point at a
folder it was installed into: pip install --target DIR ijson); the file is read whole by every
method, then only its first --first elements by the stream readers. A file cut off inside an
element stops json.load and ijson with an error, which is printed as their result.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, time
method, path, first = sys.argv[1], sys.argv[2], int(sys.argv[3])
t0 = time.perf_counter()
n, note, read = 0, "", None
if method == "json.load":
    with open(path, "rb") as fh:
        n = len(json.load(fh))
elif method == "eyrie":
    from eyrie.data.json_stream import ArrayReader
    with open(path, "rb") as fh:
        reader = ArrayReader(fh)
        for item in reader:
            if item.kind:
                note = f"{item.kind} at element {item.number}, byte {item.offset}"
                continue
            n += 1
            if first and n >= first:
                break
        read = reader.bytes_read
else:
    import ijson
    with open(path, "rb") as fh:
        try:
            for _ in ijson.items(fh, "item"):
                n += 1
                if first and n >= first:
                    break
        except Exception as exc:
            note = f"{type(exc).__name__}: {str(exc)[:60]}"
        read = fh.tell()
# VmHWM: this process's own peak (ru_maxrss would carry the parent's over the exec)
status = open("/proc/self/status").read().split("VmHWM:")[1].split()[0]
peak = int(status) / 1024
print(json.dumps({"method": method, "elements": n, "seconds": round(time.perf_counter() - t0, 2),
                  "peak_mb": round(peak), "bytes_read": read, "note": note}))
"""


def synthetic(path: Path, mb: int, seed: int = 0) -> None:
    """ShareGPT-shaped records, indent 2, until the file is about `mb` MB."""
    rng = random.Random(seed)
    words = ["speculative", "décodage", "drafter", "模型", "token", "the", "a", "of", "naïve", "🙂"]
    records, size = [], 0
    while size < mb * 1_000_000:
        turns = []
        for t in range(rng.randint(1, 8)):
            text = " ".join(rng.choice(words) for _ in range(rng.randint(5, 400)))
            turns.append({"from": "human" if t % 2 == 0 else "gpt", "value": text})
        records.append({"id": f"r{len(records)}", "conversations": turns})
        size += sum(len(t["value"]) for t in turns) + 100
    path.write_text(json.dumps(records, indent=2, ensure_ascii=False), encoding="utf-8")


def measure(method: str, path: Path, first: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, method, str(path), str(first)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if out.returncode:
        return {"method": method, "error": out.stderr.strip().splitlines()[-1][:100]}
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", type=Path)
    ap.add_argument("--mb", type=int, default=120)
    ap.add_argument("--first", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.file
        if path is None:
            path = Path(tmp) / "synthetic.json"
            synthetic(path, args.mb)
        print(f"{path}: {path.stat().st_size:,} bytes")
        try:
            import ijson  # noqa: F401

            methods = ["json.load", "eyrie", "ijson"]
        except ImportError:
            methods = ["json.load", "eyrie"]
        for method in methods:
            print(json.dumps(measure(method, path, 0)))
        for method in methods[1:]:
            print(json.dumps({"first": args.first, **measure(method, path, args.first)}))


if __name__ == "__main__":
    main()
