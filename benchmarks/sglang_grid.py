"""SGLang's EAGLE-3 over a grid of chains and trees, CUDA graphs on, against the plain server.

Each grid point is one SGLang server (steps, topk, verified tokens); the plain server is the
baseline, measured in the same run on the same prompts (token ids, batch 1, greedy). Servers
of one batch start together (startup dominates at toy scale) and are measured one at a time;
servers idle meanwhile (--sleep-on-idle). Every prompt is sent twice, for 1 and for N new
tokens: the difference is decoding alone, so a plain step and a speculative cycle are

    plain_step_ms = (t_N - t_1) / (tokens_N - 1)     cycle_ms = (t_N - t_1) / verify passes

SGLang's own accept length (meta_info.spec_accept_length) is reported for each point. With
--shape llama-3.1-8b the target and the drafter are random weights of that shape
(--load-format dummy, bf16): no drafter of that width was trained here, so what this measures
is the cycle's cost at that scale; eyrie.evaluate.cost_model turns it into a projected
speed-up for accept lengths measured elsewhere (--accept-from: a grid JSON of a trained
drafter) and for a published one (--published).

    python benchmarks/sglang_grid.py --target models/toy-llama-deep --draft results/export/sglang \
        --out grid-toy.json --log-dir logs-toy
    python benchmarks/sglang_grid.py --shape llama-3.1-8b --accept-from grid-toy.json \
        --published 3-1-4:2.90:2.13 --out grid-8b.json --log-dir logs-8b
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eyrie.common import atomic  # noqa: E402
from eyrie.common.provenance import machine  # noqa: E402
from eyrie.evaluate import cost_model  # noqa: E402
from eyrie.evaluate.online import OnlineError, Server, generate  # noqa: E402
from eyrie.sglang.launch import LAUNCHER, ONLINE_SERVER_ARGS, online_command  # noqa: E402
from eyrie.sglang.server import ServerError, free_port  # noqa: E402

CHAINS = ["1-1-2", "2-1-3", "3-1-4", "4-1-5", "5-1-6", "6-1-7"]
TREES = ["3-2-6", "4-4-8", "5-4-16"]
# What an EAGLE-3 drafter shares with its target's config.json: one decoder layer of its width.
SHARED_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
               "head_dim", "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta",
               "hidden_act", "torch_dtype")  # fmt: skip


def eagle3_draft(target: dict, draft_vocab_size: int, aux_layer_ids: list[int], **overrides):
    """The config.json of a random EAGLE-3 drafter for ``target`` (overrides: e.g. its heads)."""
    return {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
        **{k: target[k] for k in SHARED_KEYS}, "num_hidden_layers": 1,
        "draft_vocab_size": draft_vocab_size, "target_hidden_size": target["hidden_size"],
        "tie_word_embeddings": False, **overrides,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux_layer_ids,
                         "use_aux_hidden_state": True},
    }  # fmt: skip


LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "bos_token_id": 128000, "eos_token_id": 128001,
}  # fmt: skip
SMOLLM2_135M = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
    "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
    "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
    "hidden_act": "silu", "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "bos_token_id": 1, "eos_token_id": 2,
}  # fmt: skip
SHAPES = {
    # Llama-3.1-8B with a 32K draft vocabulary, as the published Llama-3.1-8B EAGLE-3 drafters
    "llama-3.1-8b": {"target": LLAMA_8B, "draft": eagle3_draft(LLAMA_8B, 32000, [1, 15, 28])},
    # SmolLM2-135M-Instruct (configs/smollm2.yaml's target) and the drafter Eyrie exports for
    # it: as many key/value heads as query heads, a 32,768-token draft vocabulary
    "smollm2-135m": {
        "target": SMOLLM2_135M,
        "draft": eagle3_draft(SMOLLM2_135M, 32768, [1, 14, 26], num_key_value_heads=9),
    },
}


def parse_point(text: str) -> tuple[int, int, int]:
    """'3-1-4' -> (steps, topk, verified tokens), SGLang's own naming of a setting."""
    try:
        steps, topk, verify = (int(x) for x in text.split("-"))
    except ValueError:
        raise SystemExit(f"grid point {text!r}: write STEPS-TOPK-VERIFY, e.g. 3-1-4") from None
    if topk == 1 and verify != steps + 1:
        raise SystemExit(f"grid point {text!r}: a chain of {steps} verifies {steps + 1} tokens")
    return steps, topk, verify


def write_shape(name: str, root: Path) -> tuple[Path, Path]:
    """config.json folders of a random-weight target and drafter (weights: --load-format dummy)."""
    dirs = []
    for part in ("target", "draft"):
        d = root / name / part
        atomic.write_json(d / "config.json", SHAPES[name][part])
        dirs.append(d)
    return dirs[0], dirs[1]


def server_flags(args) -> list[str]:
    """The online flags, with a capped KV pool and graphs for batch 1. Servers started together
    share the GPU: SGLang sizes its pool as a fraction of the memory free before its weights
    load, so the fraction is high and --max-total-tokens is what bounds each pool."""
    flags = list(ONLINE_SERVER_ARGS)
    i = flags.index("--mem-fraction-static")
    flags[i + 1] = "0.9"
    flags += ["--max-total-tokens", str(args.max_total_tokens), "--cuda-graph-max-bs", "1"]
    flags += ["--sleep-on-idle", "--max-running-requests", "1"]
    if args.shape:
        flags += ["--load-format", "dummy", "--dtype", "bfloat16"]
    elif args.dtype:
        flags += ["--dtype", args.dtype]
    return flags + shlex.split(args.extra_flags or "")


def timed(url: str, ids: list[int], max_new: int, rid: str, ignore_eos: bool) -> dict:
    r = generate(url, ids, max_new, rid, ignore_eos=ignore_eos)
    return {"seconds": r["seconds"], "output_ids": r["output_ids"], "meta": r["meta_info"]}


def measure(url: str, prompts: list[list[int]], max_new: int, tag: str, ignore_eos: bool) -> dict:
    """Decoding alone: each prompt for 1 and for max_new tokens, the difference summed."""
    for i, ids in enumerate(prompts[:2]):  # kernel compilation and warm caches: not timed
        timed(url, ids, 8, f"grid-warm-{tag}-{i}", ignore_eos)
    rows, decode_s, tokens, verify = [], 0.0, 0, 0
    for i, ids in enumerate(prompts):
        one = timed(url, ids, 1, f"grid-{tag}-{i}-1", ignore_eos)
        full = timed(url, ids, max_new, f"grid-{tag}-{i}", ignore_eos)
        n = len(full["output_ids"])
        ct = full["meta"].get("spec_verify_ct") or 0
        decode_s += full["seconds"] - one["seconds"]
        tokens += n - 1
        verify += ct
        rows.append({"new_tokens": n, "seconds": full["seconds"], "first_token_s": one["seconds"],
                     "spec_verify_ct": ct, "output_ids": full["output_ids"],
                     "spec_accept_length": full["meta"].get("spec_accept_length")})  # fmt: skip
    rec = {"decode_seconds": decode_s, "decode_tokens": tokens, "verify_passes": verify,
           "tokens_per_s": tokens / decode_s if decode_s > 0 else None, "rows": rows}  # fmt: skip
    if verify:
        # tokens per verify pass, the bonus included, as SGLang's spec_accept_length
        total = sum(r["new_tokens"] for r in rows) - len(rows)  # the prefill's token is no pass's
        rec["accept_length"] = total / verify
        rec["sglang_accept_length"] = (
            sum((r["spec_accept_length"] or 0) * r["spec_verify_ct"] for r in rows) / verify
        )
        rec["cycle_ms"] = 1e3 * decode_s / verify
    else:
        rec["plain_step_ms"] = 1e3 * decode_s / tokens
    return rec


def profile(url: str, ids: list[int], steps: int, out_dir: Path, wait_s: float = 180.0) -> dict:
    """SGLang's torch profiler over ``steps`` forward steps of one long request (the prefill
    is the first of them), without Python stacks or shapes, which would slow the host's side
    it measures; the trace summarized by benchmarks/trace_summary.py."""
    from trace_summary import read_events, summarize

    from eyrie.sglang import http

    out_dir.mkdir(parents=True, exist_ok=True)
    body = {"output_dir": str(out_dir.resolve()), "num_steps": steps, "activities": ["CPU", "GPU"],
            "with_stack": False, "record_shapes": False}  # fmt: skip
    status, text = http.post(f"{url}/start_profile", body, 60.0)
    if not http.ok(status):
        return {"status": "failed", "reason": f"/start_profile answered {status}: {text[:300]}"}
    timed(url, ids, 16 * steps, "grid-profile", ignore_eos=True)  # past the profiled steps
    # SGLang writes the trace after the last step, in place: until it reads whole, wait
    deadline, why = time.monotonic() + wait_s, f"no trace in {out_dir}"
    while time.monotonic() < deadline:
        traces = sorted(out_dir.glob("*.trace.json*"))
        try:
            if traces:
                events = read_events(traces[-1])
                return {"status": "ok", "trace": traces[-1].name, **summarize(events, steps)}
        except (OSError, EOFError, ValueError) as exc:  # a gzip or JSON tail still to come
            why = f"{traces[-1]} unreadable: {exc}"
        time.sleep(1.0)
    return {"status": "failed", "reason": f"{why} after {wait_s:.0f} s"}


def launch(args, target: Path, draft: Path | None, point: str | None, log_dir: Path) -> Server:
    steps, topk, verify = parse_point(point) if point else (3, 1, 4)
    port = free_port()
    cmd = online_command(target, port, draft_path=draft if point else None, draft_tokens=steps,
                         topk=topk, verify_tokens=verify, server_args=server_flags(args),
                         launcher=args.launcher.split() if args.launcher else LAUNCHER)  # fmt: skip
    return Server(cmd, log_dir / f"sglang-{point or 'plain'}.log", port)


def run_grid(args, target: Path, draft: Path, prompts: list[list[int]], save) -> dict:
    """Every point's record, saved after each (a run cut short keeps what it measured)."""
    points = [None, *args.grid]  # None: the plain server
    results, log_dir = {}, Path(args.log_dir)
    for start in range(0, len(points), args.parallel):
        batch = points[start : start + args.parallel]
        with contextlib.ExitStack() as stack:
            servers = [stack.enter_context(launch(args, target, draft, p, log_dir)) for p in batch]
            for point, server in zip(batch, servers, strict=True):
                name = point or "plain"
                try:
                    ready = server.wait_ready(args.launch_timeout)
                except (ServerError, OnlineError) as exc:
                    print(f"{name}: did not start: {str(exc)[-1500:]}", file=sys.stderr)
                    results[name] = {"status": "failed", "reason": str(exc)[-1500:]}
                    continue
                rec = measure(server.url, prompts, args.max_new_tokens, name, args.ignore_eos)
                if name in args.profile:
                    rec["profile"] = profile(server.url, prompts[0], args.profile_steps,
                                             log_dir / f"profile-{name}")  # fmt: skip
                results[name] = {"status": "ok", "ready_seconds": ready, **rec}
                save(results)
                print(f"{name}: {rec['tokens_per_s']:.1f} tok/s, "
                      f"accept length {rec.get('accept_length', 1.0):.3f}", flush=True)  # fmt: skip
    return results


def summarize(results: dict, args) -> dict:
    plain = results.get("plain", {})
    if plain.get("status") != "ok":
        return {"status": "no plain baseline"}
    plain_ms = plain["plain_step_ms"]
    table, chain_k, chain_ms = [], [], []
    for point in args.grid:
        r = results.get(point, {})
        if r.get("status") != "ok":
            table.append({"point": point, "status": r.get("status", "missing")})
            continue
        steps, topk, verify = parse_point(point)
        same = sum(a["output_ids"] == b["output_ids"]
                   for a, b in zip(plain["rows"], r["rows"], strict=True))  # fmt: skip
        table.append({
            "point": point, "steps": steps, "topk": topk, "verify_tokens": verify,
            "tokens_per_s": r["tokens_per_s"], "speedup": r["tokens_per_s"] / plain["tokens_per_s"],
            "accept_length": r["accept_length"], "sglang_accept_length": r["sglang_accept_length"],
            "cycle_ms": r["cycle_ms"], "cycle_over_plain": r["cycle_ms"] / plain_ms,
            "identical": same, "prompts": len(r["rows"]),
        })  # fmt: skip
        if r.get("profile"):
            table[-1]["profile"] = r["profile"]
        if topk == 1:
            chain_k.append(steps)
            chain_ms.append(r["cycle_ms"])
    out = {"plain_step_ms": plain_ms, "plain_tokens_per_s": plain["tokens_per_s"], "grid": table,
           "extra_flags": args.extra_flags or ""}  # fmt: skip
    if plain.get("profile"):
        out["plain_profile"] = plain["profile"]
    if len(set(chain_k)) >= 2:
        fit = cost_model.fit_chain(chain_k, chain_ms)
        out["chain_fit"] = {"fixed_ms": fit.fixed_ms, "per_draft_ms": fit.per_draft_ms,
                            "points": fit.points}  # fmt: skip
    cycles = {row["point"]: row["cycle_ms"] for row in table if "cycle_ms" in row}
    if args.published:
        point, length, published = args.published.split(":")
        if point in cycles:
            out["published_check"] = {"point": point, **cost_model.check_published(
                float(length), float(published), plain_ms, cycles[point])}  # fmt: skip
    if args.accept_from:
        measured = json.loads(Path(args.accept_from).read_text())
        lengths = {row["point"]: row["accept_length"] for row in measured["summary"]["grid"]
                   if "accept_length" in row}  # fmt: skip
        out["projected"] = [
            {"point": p, "accept_length": lengths[p], "label": "projected",
             "projected_speedup": cost_model.speedup(lengths[p], plain_ms, cycles[p]),
             "break_even_accept_length": cost_model.break_even(plain_ms, cycles[p])}
            for p in cycles if p in lengths
        ]  # fmt: skip
    return out


def print_summary(s: dict, label: str) -> None:
    print(f"\n== {label}: plain step {s['plain_step_ms']:.3f} ms "
          f"({s['plain_tokens_per_s']:.1f} tok/s)")  # fmt: skip
    print("point    tok/s   speed-up  accept (SGLang)  cycle ms  cycle/plain  identical")
    for r in s["grid"]:
        if "cycle_ms" not in r:
            print(f"{r['point']:<8} {r['status']}")
            continue
        print(f"{r['point']:<8} {r['tokens_per_s']:7.1f}  {r['speedup']:6.2f}x  "
              f"{r['accept_length']:.3f} ({r['sglang_accept_length']:.3f})    "
              f"{r['cycle_ms']:7.3f}   {r['cycle_over_plain']:6.2f}     "
              f"{r['identical']}/{r['prompts']}")  # fmt: skip
    profiled = [("plain", s["plain_profile"])] if s.get("plain_profile") else []
    profiled += [(r["point"], r["profile"]) for r in s["grid"] if r.get("profile")]
    for name, p in profiled:
        if p.get("status") != "ok" or "span_ms" not in p:
            print(f"profile {name}: {p.get('reason', 'no GPU events')}")
            continue
        print(f"profile {name}: {p['span_ms']:.3f} ms a step, GPU busy {p['gpu_busy_ms']:.3f} "
              f"ms ({100 * p['gpu_idle_share']:.0f} % idle), {p['kernels_per_step']:.0f} "
              "kernels")  # fmt: skip
    if "chain_fit" in s:
        f = s["chain_fit"]
        print(f"chains: cycle = {f['fixed_ms']:.3f} ms + {f['per_draft_ms']:.3f} ms x k")
    if "published_check" in s:
        c = s["published_check"]
        print(f"published {c['point']}: accept length {c['accept_length']} -> "
              f"{c['published_speedup']}x published, {c['predicted_speedup']:.2f}x by this cost "
              f"model ({100 * c['relative_error']:+.1f} %)")  # fmt: skip
    for p in s.get("projected", []):
        print(
            f"PROJECTED {p['point']}: accept length {p['accept_length']:.3f} -> "
            f"{p['projected_speedup']:.2f}x (break-even at {p['break_even_accept_length']:.2f})"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", help="target model folder")
    ap.add_argument("--draft", help="exported SGLang drafter folder")
    ap.add_argument("--shape", choices=sorted(SHAPES), help="random weights of this shape instead")
    ap.add_argument("--tokenizer", default="models/toy-llama-deep", help="renders the prompts")
    ap.add_argument("--prompts-jsonl", default="data/chat/heldout.jsonl")
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--grid", nargs="+", default=CHAINS + TREES, help="STEPS-TOPK-VERIFY points")
    ap.add_argument("--parallel", type=int, default=5, help="servers started together")
    ap.add_argument("--max-total-tokens", type=int, default=8192, help="KV pool per server")
    ap.add_argument("--launch-timeout", type=float, default=420.0)
    ap.add_argument("--dtype", help="SGLang's --dtype for a real target (its config's by default)")
    ap.add_argument("--ignore-eos", action="store_true", help="always decode max-new-tokens")
    ap.add_argument("--accept-from", help="grid JSON whose accept lengths are projected here")
    ap.add_argument("--published", help="POINT:ACCEPT_LENGTH:SPEEDUP, e.g. 3-1-4:2.90:2.13")
    ap.add_argument("--from-json", help="no servers: the summary of this earlier run's points")
    ap.add_argument("--launcher", help="server command instead of python -m sglang.launch_server")
    ap.add_argument("--extra-flags", help="more server flags for every server, plain included")
    ap.add_argument(
        "--profile",
        nargs="*",
        default=[],
        help="points (and 'plain') whose steps SGLang's profiler records",
    )
    ap.add_argument("--profile-steps", type=int, default=40)
    ap.add_argument("--out", required=True)
    ap.add_argument("--log-dir", required=True)
    args = ap.parse_args(argv)
    for point in args.grid:
        parse_point(point)
    if args.shape:
        target, draft = write_shape(args.shape, Path(args.log_dir) / "shapes")
        args.ignore_eos = True
    elif args.target and args.draft:
        target, draft = Path(args.target), Path(args.draft)
    else:
        ap.error("give --target and --draft, or --shape")

    def record(results: dict, n_prompts: int) -> dict:
        return {"target": str(target), "draft": str(draft), "shape": args.shape,
                "max_new_tokens": args.max_new_tokens, "prompts": n_prompts,
                "server_flags": server_flags(args), "machine": machine(),
                "summary": summarize(results, args), "points": results}  # fmt: skip

    if args.from_json:  # the cost model again over an earlier run's measurements
        old = json.loads(Path(args.from_json).read_text())
        args.grid = [p for p in old["points"] if p != "plain"]
        rec = record(old["points"], old["prompts"])
        rec["machine"] = old["machine"]
    else:
        from eyrie.evaluate.loading import load_prompts
        from eyrie.target.load import load_tokenizer

        prompts = [p["input_ids"] for p in load_prompts(
            args.prompts_jsonl, load_tokenizer(args.tokenizer), args.prompts)]  # fmt: skip

        def save(results: dict) -> None:
            atomic.write_json(args.out, record(results, len(prompts)))

        rec = record(run_grid(args, target, draft, prompts, save), len(prompts))
    atomic.write_json(args.out, rec)
    summary = rec["summary"]
    if "grid" in summary:
        print_summary(summary, args.shape or str(target))
    return 0 if summary.get("grid") else 1


if __name__ == "__main__":
    sys.exit(main())
