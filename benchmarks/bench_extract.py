"""Extraction time against a bare forward pass of the same batches (goal: at most 1.10x).

Each run measures extraction twice in the same process, alternating: with the writer thread
(`writer_queue` 1, the default: compression, checksums and fsync overlap the next group's
forward passes) and inline (`writer_queue` 0), so the ratio of the two comes from one run.
`--width realistic` adds a random-weight Llama of Llama-3-8B's layer shape (hidden 4096, 14336
MLP, 32 heads, 8 KV heads; --layers of them, bf16 on CUDA) with the toy tokenizer, run on the
same chat samples (their real lengths).

The baseline runs the target on exactly the batches extraction runs (same samples, same padding,
same order), with no hooks and nothing kept: the cost any capture must pay. Extraction is timed
by the extract job itself (eyrie.extract.shard), without its setup (model load, tokenization,
hashing): capture (forward with hooks up to the final norm, copies to the CPU) plus write (bf16
bits, compression, commits). Both use the same loaded, warmed-up model; runs alternate and the
median of each is reported, with the machine. On a shared machine, run it when nothing else
does: the ratio is only as steady as the CPU is free. Each extraction is paired with a bare
forward run just before it (a few seconds apart: the job's setup lies between), and each pair's
ratio is printed with the CPU time the hypervisor took from the machine meanwhile (/proc/stat
"steal"); the median of the pairs is the figure least moved by a host whose speed drifts.
The bare forwards run before the extraction in even repeats and after it in odd ones, so a
drift in one direction over the run does not weigh on one side only. A third bare forward
takes pinned inputs and the 4-D mask extraction gives the model on CUDA (the bare forward at
its fastest eagerly).
`--interrupts` also prints where the interrupts landed; `--forward-cpu` moves the pinned forward
thread to another CPU. `--writer-process dry-reply dry-touch dry-encode` runs the job with a
stand-in writer process (benchmarks/dry_writer.py) that answers without storing, only reads the
states, or only compresses them: what is left of the ratio then is the job's own side.

`--writer-process false true` runs the job's writer as a thread and as a process of its own
(extract.writer_process; the process's own time in store_group is printed as "writer process
busy"). With few commit groups the last group's write, which nothing overlaps, weighs on the
ratio: 1536 samples make 24 groups.

    python benchmarks/bench_extract.py                    # shipped toy-llama, CPU
    python benchmarks/bench_extract.py --device cuda --samples 1536 --width toy realistic \
        --writer-queue 1 --writer-process false true
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
from common import ROOT, each_and_median, machine

from eyrie.data.split import read_split
from eyrie.extract.graphs import GraphForward, attention_mask_4d
from eyrie.extract.hf import padded_batch
from eyrie.extract.job import batches as batched
from eyrie.extract.job import groups_to_do
from eyrie.extract.settings import extract_settings
from eyrie.extract.shard import ExtractJob, ShardTask, capture_for
from eyrie.extract.tokens import tokenize
from eyrie.extract.writing import use_writer_process, writing_for
from eyrie.store.codecs import shard_tokens_for
from eyrie.store.slabs import SlabPool
from eyrie.target.load import load_target, resolve_device


def target_dir(arg: str | None, tmp: Path) -> Path:
    if arg:
        return Path(arg)
    toy = ROOT / "models" / "toy-llama"
    if (toy / "config.json").is_file() and list(toy.glob("*.safetensors")):
        return toy
    from tiny_target import build_llama

    print("models/toy-llama is absent: a random Llama of the same shape stands in")
    return build_llama(tmp / "random-llama", layers=8, hidden=256)


def split_file(arg: str | None, n: int, tmp: Path) -> Path:
    src = Path(arg) if arg else ROOT / "data" / "chat" / "train.jsonl"
    out = tmp / "train.jsonl"
    if src.is_file():
        lines = [ln for ln in src.read_text(encoding="utf-8").splitlines() if ln.strip()][:n]
    else:
        from tiny_target import conversation

        lines = [json.dumps({"id": f"s{i}", "messages": conversation(i % 40, 2)}) for i in range(n)]
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def extraction_batches(good, commit_every: int, batch_size: int) -> list[list]:
    """The token ids of every batch extraction runs, in its order (groups, then batches)."""
    return [
        [group[i].input_ids for i in batch]
        for group in groups_to_do(good, commit_every, set(), set())
        for batch in batched(group, batch_size)
    ]


def bare_forward(
    model, batches, pad_id: int, device, *, pinned: bool = False, mask_4d: bool = False
) -> float:
    """Seconds of `model` over `batches`, nothing kept.

    pinned: the inputs go to the GPU from pinned memory without waiting (as extraction sends
    them), so the host queues the next batch while the GPU runs this one; otherwise each
    batch's plain copy waits for the GPU to finish the one before. mask_4d: the model is given
    the 4-D causal-and-padding mask built on the GPU, as extraction gives it on CUDA
    (eyrie.extract.hf.HFCapture), so transformers does not read the mask on the host.
    """
    cuda = pinned and device.type == "cuda"
    eager = getattr(model.config, "_attn_implementation", None) == "eager"
    additive = next(model.parameters()).dtype if eager else None  # eager adds its mask
    start = time.perf_counter()
    with torch.inference_mode():
        for seqs in batches:
            ids, mask = padded_batch(seqs, pad_id)
            if cuda:
                ids, mask = ids.pin_memory(), mask.pin_memory()
            mask = mask.to(device, non_blocking=cuda)
            model(
                input_ids=ids.to(device, non_blocking=cuda),
                attention_mask=attention_mask_4d(mask, additive) if mask_4d else mask,
                use_cache=False,
            )
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def bare_graphs(decoder, batch_size: int, pad_id: int, device, bucket: int = 64) -> GraphForward:
    """The stack without lm_head as extraction's graphs run it (same buckets, same 4-D mask),
    nothing captured: what a forward in CUDA graphs costs with no states kept."""
    additive = decoder.config._attn_implementation == "eager"
    dtype = next(decoder.parameters()).dtype if additive else None

    def body(ids, mask):
        keep = attention_mask_4d(mask, dtype)
        return (decoder(input_ids=ids, attention_mask=keep, use_cache=False).last_hidden_state,)

    return GraphForward(
        body, batch_size=batch_size, bucket_tokens=bucket, pad_token_id=pad_id, device=device
    )


def graph_loop(graphs: GraphForward, batches) -> float:
    """Seconds of `graphs` over `batches` (inputs from pinned memory, nothing kept; on the CPU
    the bucketed forward runs eagerly)."""
    cuda = graphs.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.inference_mode():
        for seqs in batches:
            graphs.run(*padded_batch(seqs, graphs.pad_token_id))
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def build_realistic(out: Path, layers: int, device: str) -> Path:
    """A random Llama of Llama-3-8B's layer shape with toy-llama's tokenizer (bf16 weights)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    toy = ROOT / "models" / "toy-llama"
    cfg = json.loads((toy / "config.json").read_text())
    config = LlamaConfig(
        vocab_size=cfg["vocab_size"],
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=4096,
        bos_token_id=cfg["bos_token_id"],
        eos_token_id=cfg["eos_token_id"],
        pad_token_id=cfg["pad_token_id"],
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    with torch.device("cuda" if device != "cpu" and torch.cuda.is_available() else "cpu"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    for f in toy.iterdir():
        if f.name.startswith(("tokenizer", "chat_template", "special_tokens")):
            shutil.copy2(f, out / f.name)
    del model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


def interrupts() -> dict[str, list[int]]:
    """/proc/interrupts: each source's count per CPU (empty where the file is absent)."""
    try:
        lines = Path("/proc/interrupts").read_text().splitlines()
    except OSError:
        return {}
    cpus = len(lines[0].split())
    out = {}
    for line in lines[1:]:
        name, _, rest = line.partition(":")
        fields = rest.split()
        counts = [int(f) for f in fields[:cpus] if f.isdigit()]
        if len(counts) == cpus:
            out[f"{name.strip()} {' '.join(fields[cpus:])}".strip()] = counts
    return out


def interrupts_since(before: dict, forward_cpu: int | None) -> str:
    """Interrupts per CPU since `before`, and the sources that hit the forward's CPU most."""
    after = interrupts()
    if not after:
        return "no /proc/interrupts"
    delta = {
        k: [a - b for a, b in zip(v, before.get(k, [0] * len(v)), strict=True)]
        for k, v in after.items()
    }
    per_cpu = [sum(col) for col in zip(*delta.values(), strict=True)]
    text = "interrupts per CPU: " + " ".join(f"{c}:{n}" for c, n in enumerate(per_cpu))
    if forward_cpu is not None and forward_cpu < len(per_cpu):
        top = sorted(delta.items(), key=lambda kv: -kv[1][forward_cpu])[:4]
        text += f"; on the forward's CPU {forward_cpu}: " + ", ".join(
            f"{v[forward_cpu]} {k[:60]}" for k, v in top if v[forward_cpu]
        )
    return text


def steal_seconds(since: float = 0.0) -> float:
    """CPU seconds the hypervisor has taken from this machine's CPUs (/proc/stat "steal",
    summed over CPUs), minus `since`; 0 where it is not reported."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK") - since
    except (OSError, IndexError, ValueError):
        return 0.0


def pin_forward_to(cpu: int) -> None:
    """Make extraction's pin plan put the forward thread on `cpu` (-1: the highest allowed)."""
    import eyrie.extract.shard as shard_module
    from eyrie.extract.cpus import forward_cpu_plan

    def plan(setting, **kwargs):
        chosen = forward_cpu_plan(setting, **kwargs)
        if chosen is None:
            return None
        allowed = os.sched_getaffinity(0)
        pick = max(allowed) if cpu < 0 else cpu
        return pick, allowed - {pick}

    shard_module.forward_cpu_plan = plan


def forward_cpu(extract: dict, writer_queue: int, device_type: str) -> int | None:
    """The CPU the extraction's forward thread was pinned to, from the plan the job makes
    (eyrie.extract.shard, with --forward-cpu's replacement in place), or None."""
    import eyrie.extract.shard as shard_module

    process = writer_queue > 0 and use_writer_process(
        extract.get("writer_process", "auto"), device_type, "hf"
    )
    plan = shard_module.forward_cpu_plan(
        extract.get("pin_forward", "auto"), writer_process=process, device_type=device_type
    )
    return plan[0] if plan is not None and writer_queue > 0 else None


def measure(target_path: Path, data: Path, tmp: Path, args, label: str) -> dict:
    target = load_target(target_path, device=args.device)
    capture = {
        "backend": "hf",
        "aux_layer_ids": None,
        "device": args.device,
        "batch_size": args.batch_size,
    }
    commit_every = max(args.batch_size, -(-args.commit_every // args.batch_size) * args.batch_size)
    good, _ = tokenize(target.tokenizer, read_split(data), args.max_tokens)
    batches = extraction_batches(good, commit_every, args.batch_size)
    pad = target.tokenizer.pad_token_id or 0
    tokens = sum(len(g.input_ids) for g in good)
    base = target.model.get_decoder()  # the same stack without the lm_head
    # Warm-up over every batch: on CUDA a pass meeting a batch shape for the first time is
    # several times slower (6.1 s against 1.4 s for the toy's 192 batches on the H200), so a
    # timed first pass would flatter whatever runs after it.
    if not args.skip_full_forward:
        bare_forward(target.model, batches[:2], pad, target.device)
    bare_forward(base, batches, pad, target.device)

    graph_bare = None  # the same stack replayed as CUDA graphs: the baseline graphs must beat
    if target.device.type == "cuda" and not args.skip_graph_baseline:
        graph_bare = bare_graphs(base, args.batch_size, pad, target.device)
        graph_loop(graph_bare, batches)  # captures every bucket's graph once
    variants = [
        (q, st, e, wt, wp, pf, cg)
        for cg in args.cuda_graphs
        for pf in args.pin_forward
        for wp in args.writer_process
        for wt in args.writer_threads
        for e in args.encoder
        for st in args.shard_tokens
        for q in args.writer_queue
    ]
    # the writer processes' slabs, kept from one run to the next (as a job's own would be made
    # in its setup; the ratios leave the setup out)
    slabs = SlabPool(keep=8)
    bare, bare_base, bare_pinned, runs = [], [], [], {v: [] for v in variants}
    bare_4d = []  # pinned inputs and the 4-D mask: the bare forward at its fastest eagerly
    bare_graph = []
    for r in range(args.repeats):
        if not args.skip_full_forward:
            bare.append(bare_forward(target.model, batches, pad, target.device))
        for variant in variants:
            q, st, enc, wt, wp, pf, cg = variant
            # bare forwards beside each extraction: its pair, a few seconds apart; before it in
            # even repeats and after it in odd ones, so a GPU or host that slows (or speeds up)
            # over a run weighs on both sides alike
            bare_after = r % 2 == 1

            def bare_pair(device=target.device):
                stolen = steal_seconds()
                bare_base.append(bare_forward(base, batches, pad, device))
                bare_pinned.append(bare_forward(base, batches, pad, device, pinned=True))
                bare_4d.append(bare_forward(base, batches, pad, device, pinned=True, mask_4d=True))
                if graph_bare is not None:
                    bare_graph.append(graph_loop(graph_bare, batches))
                return steal_seconds(since=stolen)

            if not bare_after:
                bare_stolen = bare_pair()
            setting, child = dry_child(wp)
            extract = {"shards": 1, "chunk_tokens": 256, "shard_tokens": st}
            extract.update(writer_threads=wt, writer_process=setting, pin_forward=pf)
            writing = writing_for(extract_settings(extract), q, target.device.type, "hf")
            writing = replace(writing, encoder=enc, child=child, slabs=slabs)
            out_dir = tmp / f"{label}-{name_of(*variant)}-run{r}"
            irq_before = interrupts() if args.interrupts else None
            stolen = steal_seconds()
            task = ShardTask(
                data_path=data,
                target_path=target_path,
                split="train",
                shard=0,
                out_store=out_dir / "shard-000.zarr",
                errors_csv=out_dir / "shard-000.errors.csv",
                capture={**capture, "cuda_graphs": cg},
                extract=extract,
                max_tokens=args.max_tokens,
                commit_every=args.commit_every,
                progress=False,
                weights_cache=tmp / f"{label}-weights-sha256.json",
            )
            out = ExtractJob(task, capture_for(task, target), writing).execute()
            run_stolen = steal_seconds(since=stolen)
            if bare_after:
                bare_stolen = bare_pair()
            loop = out.seconds["total"] - out.seconds["setup"]
            graphs = out.seconds.get("graph_capture", 0.0)
            print(
                f"  {name_of(*variant)} run {r} ({time.strftime('%H:%M:%S')}): bare "
                f"{'after' if bare_after else 'before'} it {bare_base[-1]:.3f} s, "
                f"bare with pinned inputs {bare_pinned[-1]:.3f} s, "
                f"and the 4-D mask {bare_4d[-1]:.3f} s, "
                + (f"bare in CUDA graphs {bare_graph[-1]:.3f} s, " if bare_graph else "")
                + f"extraction {loop:.3f} s, {graphs:.3f} s of it capturing graphs, "
                f"{out.seconds.get('slabs', 0.0):.3f} s making slabs before it "
                f"({loop / bare_base[-1]:.3f}x, {loop / bare_pinned[-1]:.3f}x, "
                f"{loop / bare_4d[-1]:.3f}x); CPU time the "
                f"host took from this machine: {bare_stolen:.2f} s during the bare forwards, "
                f"{run_stolen:.2f} s during the extraction with its setup",
                flush=True,
            )
            if irq_before is not None:
                fwd = forward_cpu(extract, q, target.device.type)
                print(
                    f"  {name_of(*variant)} run {r}: " + interrupts_since(irq_before, fwd),
                    flush=True,
                )
            stored = sum(f.stat().st_size for f in out_dir.rglob("*") if f.is_file())
            shutil.rmtree(out_dir)
            runs[variant].append(
                {
                    "graph_capture": 0.0,
                    **out.seconds,
                    "stored": stored,
                    "bare_base": bare_base[-1],
                    "bare_pinned": bare_pinned[-1],
                    "bare_4d": bare_4d[-1],
                    "bare_graph": bare_graph[-1] if bare_graph else float("nan"),
                }
            )

    med = statistics.median
    bb = med(bare_base)
    b = med(bare) if bare else float("nan")
    params = sum(p.numel() for p in target.model.parameters()) / 1e6
    hidden = target.model.config.get_text_config().hidden_size
    print(
        f"\n## {label}: {target_path.name}, {params:.1f} M params, hidden {hidden}, "
        f"{target.dtype}, {target.device}"
    )
    print(
        f"workload: {len(good)} samples, {tokens} tokens, {len(batches)} batches of <= "
        f"{args.batch_size}, max_tokens {args.max_tokens}, commit every {commit_every} samples, "
        f"{args.repeats} repeats (median)"
    )
    if bare:
        print(f"bare forward (full model):      {b:8.3f} s  {tokens / b:10.0f} tok/s")
    print(f"bare forward (no lm_head):      {bb:8.3f} s  {tokens / bb:10.0f} tok/s")
    bp = med(bare_pinned)
    print(f"  the same, inputs pinned:      {bp:8.3f} s  {tokens / bp:10.0f} tok/s")
    b4 = med(bare_4d)
    print(f"  pinned, and the 4-D mask:     {b4:8.3f} s  {tokens / b4:10.0f} tok/s")
    if bare_graph:
        bg = med(bare_graph)
        print(f"  the same, in CUDA graphs:     {bg:8.3f} s  {tokens / bg:10.0f} tok/s")
    result = {"tokens": tokens, "bare": b, "bare_base": bb}
    for (q, st, enc, wt, wp, pf, cg), rs in runs.items():
        how = "inline writes" if q == 0 else f"writer thread, queue {q}"
        how += f", cuda_graphs {cg}, writer_process {wp}, pin_forward {pf}"
        how += f", {enc} shard files, writer_threads {wt}"
        how += f", shard_tokens {st}" + (
            f" (= {shard_tokens_for(st, 256, hidden, 3)})" if st == "auto" else ""
        )
        loop = med(s["total"] - s["setup"] for s in rs)
        cap, wr, wait = (med(s[k] for s in rs) for k in ("capture", "write", "wait"))
        stored = rs[0]["stored"]
        if "writer_process_busy" in rs[0]:
            how += f" (writer process busy {med(s['writer_process_busy'] for s in rs):.3f} s)"
        print(
            f"extract, {how}: {loop:8.3f} s  {tokens / loop:10.0f} tok/s | capture {cap:.3f} s, "
            f"write+commit {wr:.3f} s, forward thread waiting for the writer {wait:.3f} s | "
            f"store {stored / tokens:.0f} B/token"
        )
        print(
            f"  ratio extract / forward without lm_head: {loop / bb:.3f}x (goal <= 1.10x: "
            f"{'met' if loop / bb <= 1.10 else 'NOT met'})"
            + (f"; / full forward {loop / b:.3f}x" if bare else "")
        )
        paired = [(s["total"] - s["setup"]) / s["bare_base"] for s in rs]
        pinned_pairs = [(s["total"] - s["setup"]) / s["bare_pinned"] for s in rs]
        print(
            "  each repeat against the forward without lm_head run beside it (its pair): "
            + each_and_median(paired)
        )
        print(
            "  each repeat against its pair with pinned inputs: "
            + each_and_median(pinned_pairs, goal=1.10)
        )
        pairs_4d = [(s["total"] - s["setup"]) / s["bare_4d"] for s in rs]
        print(
            "  each repeat against its pair with pinned inputs and the 4-D mask: "
            + each_and_median(pairs_4d, goal=1.10)
        )
        if "slabs" in rs[0]:  # in the setup, outside the ratios above: with it counted
            with_slabs = [(s["total"] - s["setup"] + s["slabs"]) / s["bare_base"] for s in rs]
            print(
                f"  the writer's slabs made and registered in the setup: "
                f"{med(s['slabs'] for s in rs):.3f} s; counted, each repeat against its pair: "
                + each_and_median(with_slabs)
            )
        if bare_graph:
            graph_pairs = [(s["total"] - s["setup"]) / s["bare_graph"] for s in rs]
            less = [(s["total"] - s["setup"] - s["graph_capture"]) / s["bare_graph"] for s in rs]
            print(
                "  each repeat against its pair in CUDA graphs: "
                + ", ".join(f"{p:.3f}x" for p in graph_pairs)
                + f" (median {med(graph_pairs):.3f}x; without the job's graph captures "
                + f"{med(less):.3f}x)"
            )
        result[name_of(q, st, enc, wt, wp, pf, cg)] = loop
    first = name_of(*variants[0])
    for variant in variants[1:]:
        name = name_of(*variant)
        print(f"  {name} vs {first}: {result[name] / result[first]:.3f}x time")
    del target
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return result


def name_of(q, st, enc, wt, wp, pf, cg) -> str:
    return f"q{q}-s{st}-{enc}-t{wt}-p{wp}-pin{pf}-g{cg}"


def auto_or_bool(text: str):
    """extract.writer_process or pin_forward on the command line: auto, true or false."""
    if text not in ("auto", "true", "false"):
        raise argparse.ArgumentTypeError(f"{text!r}: use auto, true or false")
    return text if text == "auto" else text == "true"


def writer_process_arg(text: str):
    """--writer-process: auto, true, false, or dry-MODE (a stand-in writer process)."""
    if text.startswith("dry-"):
        from dry_writer import MODES

        if text[4:] not in MODES:
            raise argparse.ArgumentTypeError(f"{text!r}: dry- takes one of {MODES}")
        return text
    return auto_or_bool(text)


def dry_child(setting) -> tuple:
    """(extract.writer_process, the module the writer process runs) for `setting`: the
    stand-in writer process for dry-MODE (benchmarks/dry_writer.py), else the store's own."""
    from eyrie.store.writer_process import STORE_WRITER

    if isinstance(setting, str) and setting.startswith("dry-"):
        os.environ["EYRIE_BENCH_DRY_WRITER"] = setting[4:]
        return True, "dry_writer"
    os.environ.pop("EYRIE_BENCH_DRY_WRITER", None)
    return setting, STORE_WRITER


def auto_or_int(text: str):
    """An extract setting given on the command line: "auto" or a whole number."""
    return text if text == "auto" else int(text)


def workload_args(description: str, samples: int) -> argparse.ArgumentParser:
    """The options every extraction benchmark shares: target, data, batches, device, repeats."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--target", help="HF folder (default: models/toy-llama)")
    ap.add_argument("--data", help="split JSONL (default: data/chat/train.jsonl)")
    ap.add_argument("--samples", type=int, default=samples)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    ap.add_argument("--repeats", type=int, default=3)
    return ap


def main(argv=None) -> int:
    ap = workload_args(__doc__.splitlines()[0], samples=128)
    ap.add_argument("--commit-every", type=int, default=64)
    ap.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    ap.add_argument(
        "--writer-queue",
        type=int,
        nargs="+",
        default=[1, 0],
        help="extract's writer_queue values to run (0: inline writes on the forward's thread)",
    )
    ap.add_argument(
        "--shard-tokens",
        nargs="+",
        default=["auto"],
        type=auto_or_int,
        help="extract.shard_tokens values to run (auto, or tokens; e.g. 16384 auto)",
    )
    ap.add_argument(
        "--writer-threads",
        nargs="+",
        default=["auto"],
        type=auto_or_int,
        help="extract.writer_threads values to run (auto: min(8, cores))",
    )
    ap.add_argument(
        "--writer-process",
        nargs="+",
        default=["auto"],
        type=writer_process_arg,
        help="extract.writer_process values to run (auto: a process on CUDA; true; false: "
        "the writer thread in this process; dry-reply, dry-touch, dry-encode: a stand-in "
        "writer process doing part of the work, benchmarks/dry_writer.py)",
    )
    ap.add_argument(
        "--pin-forward",
        nargs="+",
        default=["auto"],
        type=auto_or_bool,
        help="extract.pin_forward values to run (auto: the forward's thread on a CPU of its own "
        "with a CUDA target and the writer process; true; false)",
    )
    ap.add_argument(
        "--cuda-graphs",
        nargs="+",
        default=["auto"],
        type=auto_or_bool,
        help="capture.cuda_graphs values to run (auto: the forward replayed as CUDA graphs "
        "where the model allows it; true; false: eager)",
    )
    ap.add_argument(
        "--encoder",
        nargs="+",
        default=["eyrie"],
        choices=["eyrie", "zarr"],
        help="who encodes the shard files: eyrie (eyrie/store/shard_files.py) or zarr",
    )
    ap.add_argument(
        "--skip-full-forward",
        action="store_true",
        help="do not time the full model (with its lm_head, which extraction never computes)",
    )
    ap.add_argument(
        "--skip-graph-baseline",
        action="store_true",
        help="on CUDA, do not time the bare forward replayed as CUDA graphs (the baseline for "
        "cuda_graphs true; it doubles a long run's time)",
    )
    ap.add_argument("--width", nargs="+", default=["toy"], choices=["toy", "realistic"])
    ap.add_argument("--layers", type=int, default=8, help="layers of the realistic model")
    ap.add_argument(
        "--switch-interval",
        type=float,
        help="sys.setswitchinterval for the run (seconds; Python's default is 0.005): how "
        "often the forward and writer threads trade the GIL",
    )
    ap.add_argument(
        "--forward-cpu",
        type=int,
        help="where pinning is on, the forward thread's CPU (-1: the highest the job may use; "
        "default: extract.pin_forward's own choice, the lowest)",
    )
    ap.add_argument(
        "--interrupts",
        action="store_true",
        help="print each extraction's interrupts per CPU (/proc/interrupts) and those that hit "
        "the forward's CPU most",
    )
    args = ap.parse_args(argv)
    if args.forward_cpu is not None:
        pin_forward_to(args.forward_cpu)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
        print(f"GIL switch interval {sys.getswitchinterval()} s")

    print(f"machine:  {machine(resolve_device(args.device).type)}")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        data = split_file(args.data, args.samples, tmp)
        for width in args.width:
            if width == "toy":
                path = target_dir(args.target, tmp)
            else:
                t0 = time.perf_counter()
                path = build_realistic(tmp / "llama-4096", args.layers, args.device)
                print(f"\n(random realistic-width Llama built in {time.perf_counter() - t0:.0f} s)")
            measure(path, data, tmp, args, width)
    print(f"\ntotal wall time {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
