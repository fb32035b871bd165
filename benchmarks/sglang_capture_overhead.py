"""What Eyrie's capture patch costs an SGLang server's prefill, at Llama-3.1-8B's width.

Extraction sends each sample as one prefill (max_new_tokens 1) to a server patched to dump its
aux and final hidden states, and reads every dump back. That was timed only at a toy width
(hidden 1024). Here the target has Llama-3.1-8B's shape (random weights, --load-format dummy,
bf16; hidden 4096, 32 layers, aux ids [1, 15, 28]: 32 KiB of states a token), and two servers
get the same samples the same way, one after the other on one GPU:

- unpatched: the capture server's command line (extraction's flags and the patch's eager,
  cache-free, token-id flags), without --forward-hooks and without the bundle on PYTHONPATH;
- patched: started by eyrie.extract.sglang.patched_server as extraction starts it; each request
  goes through SglangCapture.one, which waits for its dumps, checks, reads and deletes them: the
  extraction's capture path without the store write.

Tokens/s: prompt tokens over a pass's wall time (every sample once, --concurrency in flight),
warm-up excluded; every pass has new rids, and the radix cache is off.

Where the patched server's time goes, per timed pass: the client's side (SglangCapture.one timed
whole, its dump-folder waits, DumpFolder.collect's wait for the files and its reading) and the
server's (the patch's own timings from its status file: time inside the hooks on the forward's
thread, waits for room in the writer's queue, the writer's waits for the copies and its writes).
With --py-spy, py-spy samples the patched server's scheduler process during each concurrency's
passes and the leaf frames are tallied (any release of the patch, the older one included).

EYRIE_SOURCE=DIR imports Eyrie (and so the patch the bundle copies) from DIR instead of this
checkout, to measure an earlier release with this script; --unpatched-from then reuses the
unpatched rates of an earlier run of the same call instead of starting that server again.

    python benchmarks/sglang_capture_overhead.py --json overhead.json          # on a GPU
    python benchmarks/sglang_capture_overhead.py --dry-run --json dry.json     # shape, tokens
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if os.environ.get("EYRIE_SOURCE"):  # an earlier release of Eyrie, measured by this script
    sys.path.insert(0, str(Path(os.environ["EYRIE_SOURCE"]).resolve()))
sys.path.insert(1, str(Path(__file__).resolve().parent))

from pyspy_stacks import py_spy, scheduler_pid, tally_stacks  # noqa: E402

from eyrie.common import atomic  # noqa: E402
from eyrie.common.provenance import machine  # noqa: E402
from eyrie.evaluate.online import OnlineError, generate  # noqa: E402
from eyrie.sglang.launch import CAPTURE_SERVER_ARGS, capture_command, launcher  # noqa: E402
from eyrie.sglang.patch.bundle import build_bundle as write_bundle  # noqa: E402
from eyrie.sglang.patch.bundle import server_args as patch_args  # noqa: E402
from eyrie.sglang.patch.manifest import load_manifest  # noqa: E402
from eyrie.sglang.patch.settings import sglang_settings  # noqa: E402
from eyrie.sglang.server import ready_server  # noqa: E402
from eyrie.target.layers import default_aux_layer_ids  # noqa: E402

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def build_target(args, work: Path) -> Path:
    """--target, or sglang_grid's 8B-shaped target (config.json) with --tokenizer's files."""
    from sglang_grid import write_shape

    if args.target:
        return Path(args.target)
    target, _draft = write_shape("llama-3.1-8b", work / "shapes")
    for name in TOKENIZER_FILES:
        if (Path(args.tokenizer) / name).is_file():
            shutil.copyfile(Path(args.tokenizer) / name, target / name)
    return target


def capture_settings(args, dummy: bool) -> dict:
    """capture.sglang as an extraction of this target would have it (schema defaults filled)."""
    return sglang_settings({"sglang": {
        "dtype": args.dtype, "chunked_prefill_size": args.chunked_prefill_size,
        "server_args": [*CAPTURE_SERVER_ARGS, *(["--load-format", "dummy"] if dummy else [])],
        "dump_root": args.dump_root, "concurrency": max(args.concurrency),
        "launcher": args.launcher.split() if args.launcher else launcher()}})  # fmt: skip


def load_samples(args, target: Path) -> tuple[list[tuple[str, list[int]]], int]:
    """(sample id, token ids) of the first --samples chat samples as extraction tokenizes them
    (or of fixed-length random ids), and how many samples were skipped as extraction would."""
    if args.synthetic_tokens:
        vocab = json.loads((target / "config.json").read_text())["vocab_size"]
        rng = np.random.default_rng(0)
        ids = rng.integers(0, vocab, (args.samples, args.synthetic_tokens))
        return [(f"syn{i}", row.tolist()) for i, row in enumerate(ids)], 0
    from eyrie.data.chat_tokens import SampleError, tokenize_chat
    from eyrie.target.load import load_tokenizer

    tokenizer, samples, skipped = load_tokenizer(target), [], 0
    with open(args.data, encoding="utf-8") as lines:
        for row in map(json.loads, lines):
            if len(samples) == args.samples:
                break
            try:
                tok = tokenize_chat(tokenizer, row["messages"], args.max_tokens)
            except SampleError:
                skipped += 1
                continue
            samples.append((str(row["id"]), tok.input_ids.tolist()))
    return samples, skipped


def build_bundle(args, target: Path, work: Path) -> tuple[Path, dict]:
    """The patch bundle for this target, as verify_env and patch_server would write it."""
    from eyrie.verify.stage import check_sglang

    if args.bundle:
        return Path(args.bundle), load_manifest(Path(args.bundle))
    config = json.loads((target / "config.json").read_text())
    aux_ids = default_aux_layer_ids(config["num_hidden_layers"])
    check = check_sglang(args.sglang_source, config["architectures"][:1],
                         config["num_hidden_layers"], aux_ids)  # fmt: skip
    atomic.write_json(work / "verify-report.json", {"backend": "sglang", "sglang": [check]})
    manifest = write_bundle(work / "verify-report.json", work / "patch", aux_layer_ids=aux_ids,
                            dump_root=args.dump_root)  # fmt: skip
    return work / "patch", manifest


def timed_pass(send, samples: list, concurrency: int, tag: str) -> dict:
    """Every sample sent once by send(rid, ids) -> state bytes, `concurrency` in flight: as
    many threads, or send.threads(concurrency) (the patched client's, which keeps
    `concurrency` requests at the server and reads dumps on the threads beyond)."""
    threads = send.threads(concurrency) if hasattr(send, "threads") else concurrency
    with ThreadPoolExecutor(threads, thread_name_prefix="bench") as pool:
        t0 = time.perf_counter()
        state_bytes = list(pool.map(lambda s: send(f"{tag}{s[0]}", s[1]), samples))
        seconds = time.perf_counter() - t0
    tokens = sum(len(ids) for _, ids in samples)
    return {"requests": len(state_bytes), "prompt_tokens": tokens, "seconds": seconds,
            "tokens_per_s": tokens / seconds, "state_bytes": sum(state_bytes)}  # fmt: skip


def plain_sender(url: str):
    """send() of the unpatched server: one prefill by token ids, its prompt length checked."""

    def send(rid: str, ids: list[int]) -> int:
        meta = generate(url, ids, 1, rid)["meta_info"]
        if meta.get("prompt_tokens") not in (None, len(ids)) or meta.get("cached_tokens"):
            raise OnlineError(f"{rid}: sent {len(ids)} tokens, the server answered {meta}")
        return 0

    return send


def capture_sender(cap, clock: dict):
    """send() of the patched server: SglangCapture.one (request, then its dumps read back);
    `clock` sums the seconds spent in one() and, within it, in DumpFolder.collect."""
    collect = cap.folder.collect

    def timed_collect(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return collect(*args, **kwargs)
        finally:
            clock["collect_s"] += time.perf_counter() - t0

    cap.folder.collect = timed_collect

    def send(rid: str, ids: list[int]) -> int:
        t0 = time.perf_counter()
        got = cap.one(rid, np.asarray(ids, dtype=np.int64))
        clock["one_s"] += time.perf_counter() - t0
        if got[0] == "error":
            raise RuntimeError(f"the patched server refused {rid}: {got[1]}: {got[2]}")
        aux, final = got
        return aux.numel() * aux.element_size() + final.numel() * final.element_size()

    def threads(concurrency: int) -> int:
        """The pass's threads; `concurrency` of them at the server at a time (a release
        without the client's slots, EYRIE_SOURCE's, gets `concurrency` threads)."""
        if not hasattr(cap, "slots"):
            return concurrency
        from eyrie.extract.sglang import client_threads

        cap.slots = threading.Semaphore(concurrency)
        return client_threads(concurrency)

    send.threads = threads
    return send


CLIENT_FIELDS = ("waited_s", "dump_wait_s", "read_s")  # DumpFolder.stats (older: waited_s only)
SERVER_FIELDS = ("hooks_s", "queue_wait_s", "copy_wait_s", "write_s", "bytes_written")


def profile_now(folder, clock: dict) -> dict:
    """The client's and the server's running totals (None where a release has none). The patch
    refreshes its status file once its writer has been idle for 0.5 s: wait for that."""
    time.sleep(0.8)
    out = {k: clock[k] for k in ("one_s", "collect_s")}
    out.update({k: getattr(folder.stats, k, None) for k in CLIENT_FIELDS})
    statuses = [
        st for st in folder.statuses() if st.get("manifest_sha256") == folder.manifest_sha256
    ]
    timings = [st.get("timings") for st in statuses if st.get("timings")]
    for k in SERVER_FIELDS:
        out[f"server_{k}"] = sum(t.get(k, 0) for t in timings) if timings else None
    return out


def profile_delta(before: dict, after: dict) -> dict:
    return {k: (None if after[k] is None or before[k] is None else round(after[k] - before[k], 4))
            for k in after}  # fmt: skip


def profiled_pass(send, samples: list, c: int, tag: str, probe=None) -> dict:
    """timed_pass, with the change of `probe()`'s running profile totals over it."""
    before = probe() if probe else None
    out = timed_pass(send, samples, c, tag)
    if probe:
        out["profile"] = profile_delta(before, probe())
    return out


def concurrency_run(name: str, c: int, passes: list[dict]) -> dict:
    """A concurrency's record (median rate, its passes), its rates and profiles printed."""
    rates = [q["tokens_per_s"] for q in passes]
    print(f"{name} c={c}: " + ", ".join(f"{r:,.0f}" for r in rates) + " tok/s", flush=True)
    for q in passes:
        if "profile" in q:
            print(f"  profile ({q['seconds']:.2f} s pass): {json.dumps(q['profile'])}")
    return {"median_tokens_per_s": statistics.median(rates), "passes": passes}


def measure(send, samples: list, args, name: str, probe=None, spy=None) -> dict:
    """Warm-up (untimed), then --passes timed passes at each --concurrency; `probe()` gives
    running profile totals (each pass gets their change), `spy(c)` a py-spy context."""
    timed_pass(send, samples[: args.warmup], max(args.concurrency), f"warm-{name}-")
    runs = {}
    for c in args.concurrency:
        with spy(c) if spy else nullcontext() as stacks:
            passes = [profiled_pass(send, samples, c, f"c{c}p{p}-{name}-", probe)
                      for p in range(args.passes)]  # fmt: skip
        runs[str(c)] = concurrency_run(name, c, passes)
        runs[str(c)]["py_spy"] = tally_stacks(stacks)
        if runs[str(c)]["py_spy"]:
            print(f"  py-spy: {json.dumps(runs[str(c)]['py_spy'])}", flush=True)
    return runs


def plain_command(settings: dict, target: Path, manifest: dict):
    """command(port) of the unpatched server: extraction's, less --forward-hooks."""
    return lambda port: capture_command(
        target, port, launcher=settings["launcher"], tp=1, dtype=settings["dtype"],
        chunked_prefill_size=settings["chunked_prefill_size"],
        server_args=settings["server_args"], patch_args=list(manifest["server_flags"]))  # fmt: skip


def run_plain(args, settings, target, manifest, samples, log_dir) -> dict:
    command = plain_command(settings, target, manifest)
    with ready_server(command, log_dir / "unpatched.log", settings["launch_timeout_s"]) as server:
        return {"ready_s": server.ready_s, "command": server.cmd,
                "runs": measure(plain_sender(server.url), samples, args, "unpatched")}  # fmt: skip


@contextmanager
def patched_client(args, settings, target, bundle, manifest, log_dir, sent: int):
    """(send, probe, spy, result) of a patched server started as extraction starts it; on
    leaving, `result` gets the dump counts, checked against the `sent` requests."""
    from eyrie.extract.sglang import SglangCapture, patched_server

    prefix, log = f"{settings['rid_prefix']}bench:", log_dir / "patched.log"
    with patched_server(bundle=bundle, manifest=manifest, target_path=target, settings=settings,
                        rid_prefix=prefix, log_path=log) as (url, folder):  # fmt: skip
        cap = SglangCapture(url, folder, settings, prefix)
        clock = {"one_s": 0.0, "collect_s": 0.0}
        pid = scheduler_pid(folder.server) if args.py_spy else None
        result = {"ready_s": folder.server.ready_s, "command": folder.server.cmd}
        try:
            spy = lambda c: py_spy(args.py_spy, pid, log_dir / f"py-spy-c{c}.txt")  # noqa: E731
            yield capture_sender(cap, clock), lambda: profile_now(folder, clock), spy, result
        finally:
            cap.close()
        stats = folder.stats
        if stats.requests != sent or stats.chunks < sent:
            raise SystemExit(f"patched: dumps of {stats.requests} requests read ({stats.chunks} "
                             f"files) for {sent} sent: the capture did not happen")  # fmt: skip
        result.update({"dumped_requests": stats.requests, "dump_files": stats.chunks,
                       "dumped_tokens": stats.tokens, "chunked_requests": stats.chunked,
                       "dump_wait_s": stats.waited_s})  # fmt: skip


def sent_requests(args, samples: list) -> int:
    return len(samples[: args.warmup]) + len(args.concurrency) * args.passes * len(samples)


def run_patched(args, settings, target, bundle, manifest, samples, log_dir) -> dict:
    sent = sent_requests(args, samples)
    with patched_client(args, settings, target, bundle, manifest, log_dir, sent) as client:
        send, probe, spy, result = client
        result["runs"] = measure(send, samples, args, "patched", probe=probe, spy=spy)
    return result


def with_memory(settings: dict, fraction: float) -> dict:
    """settings whose server_args hold --mem-fraction-static `fraction` (replacing any)."""
    args, out = list(settings["server_args"]), []
    while args:
        flag = args.pop(0)
        if flag == "--mem-fraction-static":
            args.pop(0)
        elif not flag.startswith("--mem-fraction-static="):
            out.append(flag)
    return {**settings, "server_args": [*out, "--mem-fraction-static", str(fraction)]}


def run_paired(args, settings, target, bundle, manifest, samples, log_dir) -> dict:
    """Both servers up at once on the GPU, their passes interleaved (unpatched then patched,
    then the other way round): a drift of the machine's speed during the run moves both sides
    of a pair alike. Each pair's ratio is kept; the median of a concurrency's pairs is its
    ratio. The unpatched server starts first with the smaller share of GPU memory, since
    SGLang sizes its KV pool from what is free at its start."""
    plain_mem, patched_mem = args.paired_memory
    command = plain_command(with_memory(settings, plain_mem), target, manifest)
    sent = sent_requests(args, samples)
    with (ready_server(command, log_dir / "unpatched.log", settings["launch_timeout_s"]) as server,
          patched_client(args, with_memory(settings, patched_mem), target, bundle, manifest,
                         log_dir, sent) as client):  # fmt: skip
        send, probe, _spy, patched = client
        sends = {"unpatched": plain_sender(server.url), "patched": send}
        for name, s in sends.items():
            timed_pass(s, samples[: args.warmup], max(args.concurrency), f"warm-{name}-")
        runs = {"unpatched": {}, "patched": {}}
        probes = {"unpatched": None, "patched": probe}
        for c in args.concurrency:
            passes = {"unpatched": [], "patched": []}
            for p in range(args.passes):
                for name in ("unpatched", "patched")[:: 1 if p % 2 == 0 else -1]:
                    tag = f"c{c}p{p}-{name}-"
                    passes[name].append(profiled_pass(sends[name], samples, c, tag, probes[name]))
            for name in runs:
                runs[name][str(c)] = concurrency_run(name, c, passes[name])
            plain, ours = passes["unpatched"], passes["patched"]
            pairs = [b["tokens_per_s"] / a["tokens_per_s"]
                     for a, b in zip(plain, ours, strict=True)]  # fmt: skip
            runs["patched"][str(c)]["pair_ratios"] = [round(r, 4) for r in pairs]
            print("  pairs (patched/unpatched):", ", ".join(f"{r:.3f}" for r in pairs), flush=True)
    patched["runs"] = runs["patched"]
    return {"ready_s": server.ready_s, "command": server.cmd, "runs": runs["unpatched"],
            "memory": plain_mem}, {**patched, "memory": patched_mem}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", help="target folder (default: Llama-3.1-8B's shape); "
                    "--load-format dummy when it holds no *.safetensors")  # fmt: skip
    ap.add_argument("--tokenizer", default="models/toy-llama-deep", help="copied into the shape")
    ap.add_argument("--data", default="data/chat/train.jsonl")
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=512, help="dataset.max_tokens")
    ap.add_argument("--synthetic-tokens", type=int, help="random prompts of this many tokens")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[16], help="requests in flight")
    ap.add_argument("--passes", type=int, default=3, help="timed passes per concurrency")
    ap.add_argument("--warmup", type=int, default=32, help="untimed requests first")
    ap.add_argument("--dtype", default="bfloat16", help="capture.sglang.dtype")
    ap.add_argument("--chunked-prefill-size", type=int, help="capture.sglang.chunked_prefill_size")
    ap.add_argument("--bundle", help="an existing patch bundle (default: built for the target)")
    ap.add_argument("--sglang-source", default="installed", help="verify.sglang for the bundle")
    ap.add_argument("--dump-root", default="/dev/shm", help="capture.sglang.dump_root")
    ap.add_argument("--launcher", help="server command instead of python -m sglang.launch_server")
    ap.add_argument("--work", default="benchmarks/out/capture-overhead", help="shape, bundle, logs")
    ap.add_argument("--py-spy", help="py-spy binary: sample the patched server's scheduler")
    ap.add_argument("--unpatched-from", help="a JSON of this script: take its unpatched runs")
    ap.add_argument(
        "--paired",
        action="store_true",
        help="both servers up at once, their passes interleaved (one GPU holds both)",
    )
    ap.add_argument("--paired-memory", type=float, nargs=2, default=[0.3, 0.5],
                    metavar=("UNPATCHED", "PATCHED"),
                    help="--mem-fraction-static of each, paired")  # fmt: skip
    ap.add_argument("--dry-run", action="store_true", help="target, samples and commands only")
    ap.add_argument("--json", required=True)
    args = ap.parse_args(argv)
    work = Path(args.work)
    target = build_target(args, work)
    dummy = not any(target.glob("*.safetensors"))
    samples, skipped = load_samples(args, target)
    lengths = sorted(len(ids) for _, ids in samples)
    settings = capture_settings(args, dummy)
    bundle, manifest = build_bundle(args, target, work)
    installed = next((d.version for d in importlib.metadata.distributions(name="sglang")), None)
    rec = {"target": str(target), "dummy_weights": dummy, "bundle": str(bundle),
           "mechanism": manifest["mechanism"], "sglang_verified": manifest["sglang"]["version"],
           "sglang_installed": installed, "aux_layer_ids": manifest["aux_layer_ids"],
           "machine": machine(), "samples": len(samples), "skipped_samples": skipped,
           "prompt_tokens": sum(lengths), "concurrency": args.concurrency,
           "lengths": {"min": lengths[0], "median": lengths[len(lengths) // 2], "max": lengths[-1]},
           "passes": args.passes, "warmup": args.warmup, "settings": settings}  # fmt: skip
    print(f"{len(samples)} samples ({skipped} skipped), {sum(lengths):,} prompt tokens, lengths "
          f"{rec['lengths']}; SGLang {installed} (bundle {rec['sglang_verified']}, "
          f"{rec['mechanism']}); GPU {rec['machine']['gpu']}", flush=True)  # fmt: skip
    if args.dry_run:
        rec["unpatched_command"] = plain_command(settings, target, manifest)(0)
        both = len(manifest["server_flags"])  # the patch adds the rest, and its PYTHONPATH
        rec["patch_adds"] = patch_args(bundle, manifest, "DUMP_DIR", "eyrie-bench:")[both:]
        print("unpatched:", *rec["unpatched_command"], "\nthe patch adds:", *rec["patch_adds"])
        atomic.write_json(args.json, rec)
        return 0
    log_dir = work / "logs"
    rec["eyrie_source"] = os.environ.get("EYRIE_SOURCE") or "this checkout"
    rec["paired"] = args.paired
    if args.paired:
        rec["unpatched"], rec["patched"] = run_paired(
            args, settings, target, bundle, manifest, samples, log_dir
        )
    elif args.unpatched_from:
        rec["unpatched"] = json.loads(Path(args.unpatched_from).read_text())["unpatched"]
        rec["unpatched"]["from"] = args.unpatched_from
    else:
        rec["unpatched"] = run_plain(args, settings, target, manifest, samples, log_dir)
    if not args.paired:
        atomic.write_json(args.json, rec)  # kept if the patched server fails
        rec["patched"] = run_patched(args, settings, target, bundle, manifest, samples, log_dir)
    p = rec["patched"]
    for c in map(str, args.concurrency):
        plain, patched = rec["unpatched"]["runs"][c]["median_tokens_per_s"], p["runs"][c]
        ratio = patched["median_tokens_per_s"] / plain
        if "pair_ratios" in patched:
            ratio = statistics.median(patched["pair_ratios"])  # of the pairs, not of the medians
        patched["ratio_to_unpatched"] = ratio
        print(f"c={c}: unpatched {plain:,.0f} tok/s, patched {patched['median_tokens_per_s']:,.0f}"
              f" tok/s (dumps read back), patched/unpatched {ratio:.3f}")  # fmt: skip
    mib = p["runs"][c]["passes"][-1]["state_bytes"] / 2**20
    print(f"dumps: {p['dumped_requests']} requests, {p['dump_files']} files, "
          f"{p['dumped_tokens']:,} tokens; {mib:,.1f} MiB of states a pass")  # fmt: skip
    atomic.write_json(args.json, rec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
