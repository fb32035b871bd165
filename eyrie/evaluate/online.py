"""SGLang's own acceptance and speed: serve the target with and without the exported drafter.

Two servers in turn on 127.0.0.1 and a free port (retried on a port clash), the same prompts
(token ids, batch 1, greedy) to each: the plain one gives baseline tokens/s and outputs; the
EAGLE-3 one gives tokens/s and SGLang's own accept length (``meta_info.spec_accept_length``:
tokens emitted per verify pass, bonus token included). Every turn of a held-out conversation
is served: a later one (MT-bench's second question) after the server's own earlier answers.
Several drafts (evaluate.sglang.settings: chains, trees) are each served against the one plain
server's run. The launcher waits for /health with a
timeout, stops early with the log's tail when the server dies, and always stops the server's
whole process group.

Only standard-library HTTP is used, so this module runs on a GPU image that has SGLang and
nothing else of Eyrie's dependencies but torch.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from eyrie.common import atomic
from eyrie.common.errors import EyrieError
from eyrie.evaluate.summary import method_text
from eyrie.sglang import http
from eyrie.sglang.launch import LAUNCHER, ONLINE_SERVER_ARGS, online_command
from eyrie.sglang.server import ServerError, SglangServer, ready_server
from eyrie.sglang.server import free_port as free_port  # for a Server started by hand

DEFAULT_SERVER_ARGS = ONLINE_SERVER_ARGS  # evaluate.sglang.server_args: null
EAGER_FLAG = "--disable-cuda-graph"
# evaluate.sglang.cuda_graph -> the modes measured, the headline one first
MODES = {True: ("cuda_graph",), False: ("eager",), "both": ("cuda_graph", "eager")}


class OnlineError(EyrieError, RuntimeError):
    """The server could not be started or answered wrongly; the message says what to do."""


server_command = online_command  # the launch command of one server (eyrie.sglang.launch)


def modes_of(cuda_graph) -> tuple[str, ...]:
    try:
        return MODES[cuda_graph]
    except (KeyError, TypeError):
        raise OnlineError(
            f"evaluate.sglang.cuda_graph is {cuda_graph!r}; use true (CUDA graphs, as deployed), "
            "false (eager: --disable-cuda-graph) or both"
        ) from None


def mode_args(server_args: Sequence[str], mode: str) -> list[str]:
    """The server flags of one mode: eager adds --disable-cuda-graph."""
    if EAGER_FLAG in server_args:
        raise OnlineError(
            f"evaluate.sglang.server_args holds {EAGER_FLAG}; remove it and set "
            "evaluate.sglang.cuda_graph: false (or both) instead, so the record names the mode"
        )
    return [*server_args, EAGER_FLAG] if mode == "eager" else list(server_args)


class Server(SglangServer):
    """The extract stage's server lifecycle, with this stage's config key and error type."""

    def start(self) -> Server:
        try:
            return super().start()
        except ServerError as exc:
            raise OnlineError(str(exc)) from None

    def wait_healthy(self, timeout: float, poll: float = 1.0) -> float:
        """Seconds until GET /health answered 200; OnlineError with the log tail otherwise."""
        try:
            return self.wait_ready(timeout, poll, key="evaluate.sglang.launch_timeout_s")
        except ServerError as exc:
            raise OnlineError(str(exc)) from None


def post_json(url: str, payload: dict, timeout: float = 600.0) -> dict:
    """The parsed answer of a JSON POST; any failure or error status raises OnlineError."""
    try:
        status, text = http.post(url, payload, timeout)
    except http.HttpError as exc:
        raise OnlineError(str(exc)) from None
    if not http.ok(status):
        raise OnlineError(f"POST {url} answered {status}: {text[:500]}")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise OnlineError(f"POST {url} failed: {exc}") from None


def generate(
    url: str, input_ids: list[int], max_new_tokens: int, rid: str, ignore_eos: bool = False
) -> dict:
    """One greedy request by token ids: output_ids, seconds and the meta_info it returned
    (`ignore_eos`: always max_new_tokens, for timing)."""
    params = {"temperature": 0.0, "max_new_tokens": int(max_new_tokens)}
    if ignore_eos:
        params["ignore_eos"] = True
    payload = {"input_ids": list(map(int, input_ids)), "rid": rid, "sampling_params": params}
    t0 = time.perf_counter()
    out = post_json(f"{url}/generate", payload)
    seconds = time.perf_counter() - t0
    if isinstance(out, list):
        out = out[0]
    ids = out.get("output_ids")
    if ids is None:
        raise OnlineError(
            f"{url}/generate answered without output_ids (keys {sorted(out)}); start the server "
            "with --skip-tokenizer-init"
        )
    return {"output_ids": list(ids), "seconds": seconds, "meta_info": out.get("meta_info", {})}


def differences(plain_rows: list[dict], spec_rows: list[dict]) -> list[dict]:
    """Where each prompt's served outputs part: its id, the new token's index and both tokens
    (eyrie.evaluate.compare.first_difference; the servers return no logits, so no margin)."""
    from eyrie.evaluate.compare import first_difference
    from eyrie.evaluate.speculate import Generation

    out = []
    for a, b in zip(plain_rows, spec_rows, strict=True):
        pair = (
            Generation(a["output_ids"], a["seconds"]),
            Generation(b["output_ids"], b["seconds"]),
        )
        diff = first_difference([pair])
        if diff is not None:
            out.append({"id": a["id"], **{k: diff[k] for k in ("index", "plain", "spec")}})
    return out


def measure(url: str, prompts: list[dict], max_new_tokens: int, tag: str, tokenizer=None) -> dict:
    """Each prompt in turn (batch 1, as eyrie.evaluate.speculate), every turn of it: a later
    turn (MT-bench's second question) is asked after this server's own earlier answers
    (eyrie.evaluate.compare.decode_turns, which needs ``tokenizer``). Outputs, timings and
    accept lengths, per conversation."""
    from eyrie.evaluate.compare import decode_turns
    from eyrie.evaluate.speculate import Generation

    rows = []
    for i, p in enumerate(prompts):
        calls: list[dict] = []

        def decode(ids: list[int], i=i, calls=calls) -> Generation:
            rid = f"eyrie-{tag}-{i}" + (f"-t{len(calls)}" if calls else "")
            calls.append(generate(url, ids, max_new_tokens, rid))
            return Generation(calls[-1]["output_ids"], calls[-1]["seconds"])

        gen = decode_turns(decode, p, tokenizer)
        metas = [c["meta_info"] for c in calls]
        verify = [m.get("spec_verify_ct") for m in metas]
        lengths = [m.get("spec_accept_length") for m in metas]
        row_verify = sum(verify) if all(verify) else None
        row_accept = None
        if row_verify:  # weighted by verify passes, like a total
            row_accept = sum(a * v for a, v in zip(lengths, verify, strict=True)) / row_verify
        elif all(a is not None for a in lengths):
            row_accept = sum(lengths) / len(lengths)
        rows.append(
            {
                "id": p["id"],
                "input_ids": list(map(int, p["input_ids"])),
                "new_tokens": len(gen.tokens),
                "turns": [len(c["output_ids"]) for c in calls],
                "seconds": gen.seconds,
                "output_ids": gen.tokens,
                "spec_accept_length": row_accept,
                "spec_verify_ct": row_verify,
            }
        )
    tokens = sum(r["new_tokens"] for r in rows)
    seconds = sum(r["seconds"] for r in rows)
    verify = [r["spec_verify_ct"] for r in rows if r["spec_verify_ct"]]
    lengths = [r["spec_accept_length"] for r in rows if r["spec_accept_length"] is not None]
    accept = None
    if verify and len(verify) == len(rows):  # weighted by verify passes, like a total
        accept = sum(r["spec_accept_length"] * r["spec_verify_ct"] for r in rows) / sum(verify)
    elif lengths:
        accept = sum(lengths) / len(lengths)
    return {
        "new_tokens": tokens,
        "turns": sum(len(r["turns"]) for r in rows),
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds > 0 else None,
        "accept_length": accept,
        "rows": rows,
    }


def not_run(reason: str) -> dict:
    return {"status": "not run", "reason": reason}


def why_not(backend: str) -> str | None:
    """Why the online measurement cannot run here, or None when it can."""
    if backend != "sglang":
        return (
            f"capture.backend is {backend!r}; the online SGLang measurement runs with "
            "capture.backend: sglang"
        )
    try:
        import torch

        if not torch.cuda.is_available():
            return "no CUDA GPU on this node (SGLang serves on GPUs)"
    except ImportError:
        return "torch is not importable"
    import importlib.util

    if importlib.util.find_spec("sglang") is None:
        return "the sglang package is not importable in this environment"
    return None


def served_settings(draft_tokens: int, topk: int = 1, verify_tokens=None, settings=None) -> list:
    """The drafts to serve: ``settings`` (evaluate.sglang.settings) with their defaults filled
    in, or the one given by the evaluate section's keys."""
    given = settings or [
        {"draft_tokens": draft_tokens, "topk": topk, "verify_tokens": verify_tokens}
    ]
    out = []
    for s in given:
        k, branches = int(s["draft_tokens"]), int(s.get("topk") or 1)
        verify = s.get("verify_tokens")
        if branches > 1 and verify is None:
            raise OnlineError(
                f"evaluate.sglang.settings entry {s} has topk {branches} and no verify_tokens; "
                "give the tree's verified node count (e.g. verify_tokens: 8)"
            )
        out.append({"draft_tokens": k, "topk": branches,
                    "verify_tokens": k + 1 if branches == 1 else int(verify),
                    "algorithm": s.get("algorithm", "EAGLE3")})  # fmt: skip
    # the drafter's settings first: the record's headline is the first one served
    return sorted(out, key=lambda s: s["algorithm"] == "NGRAM")


def dflash_settings(draft_dir) -> list | None:
    """The one setting a DFlash export is served with (its block's drafts); None otherwise."""
    cfg_path = Path(draft_dir) / "config.json"
    if not draft_dir or not cfg_path.is_file():
        return None
    cfg = json.loads(cfg_path.read_text())
    if cfg.get("architectures") != ["DFlashDraftModel"]:
        return None
    return [{"draft_tokens": int(cfg["block_size"]) - 1, "topk": 1, "algorithm": "DFLASH"}]


def setting_name(s: dict) -> str:
    """SpecBundle's notation: steps-topk-verified (3-1-4 is a chain of 3)."""
    return f"{s['draft_tokens']}-{s['topk']}-{s['verify_tokens']}"


def run_key(row: dict) -> str:
    """A served setting's key: its point, led by the algorithm unless EAGLE-3's, so that NGRAM's
    7-1-8 and EAGLE-3's 7-1-8 keep their own rows."""
    algo = row["algorithm"]  # every row has one: served_settings fills in EAGLE3
    return row["setting"] if algo == "EAGLE3" else f"{algo} {row['setting']}"


def measure_servers(
    target_dir,
    draft_dir,
    prompts: list[dict],
    *,
    max_new_tokens: int,
    draft_tokens: int,
    log_dir,
    launch_timeout: float = 600.0,
    server_args: Sequence[str] = DEFAULT_SERVER_ARGS,
    launcher: Sequence[str] = LAUNCHER,
    warmup: int = 1,
    cuda_graph=True,
    topk: int = 1,
    verify_tokens: int | None = None,
    settings: Sequence[dict] | None = None,
    tokenizer=None,
) -> dict:
    """Per mode (CUDA graphs, eager, or both): the plain server, then one EAGLE-3 server per
    setting, on the same prompts (every turn). The record's top-level figures are the first
    mode's first setting's (``mode`` and ``setting`` say which); ``modes`` holds every mode's,
    each with its ``settings``."""
    modes = modes_of(cuda_graph)
    flags = {mode: mode_args(server_args, mode) for mode in modes}  # refused before any launch
    drafts = served_settings(draft_tokens, topk, verify_tokens, settings)
    summaries = {}
    for mode in modes:
        summaries[mode] = _run_mode(
            target_dir, draft_dir, prompts, drafts, max_new_tokens=max_new_tokens,
            log_dir=Path(log_dir) / mode if len(modes) > 1 else Path(log_dir),
            launch_timeout=launch_timeout, server_args=flags[mode], launcher=launcher,
            warmup=warmup, tokenizer=tokenizer,
        )  # fmt: skip
        summaries[mode]["mode"] = mode
    head = summaries[modes[0]]
    return {"status": "ok", **head, "modes": summaries}


def _serve(command, log, launch_timeout, prompts, max_new_tokens, name, warmup, tokenizer):
    """One server's measurement (eyrie.evaluate.online.measure), the server stopped after."""
    key = "evaluate.sglang.launch_timeout_s"
    try:
        with ready_server(command, log, launch_timeout, key=key, server_cls=Server) as server:
            for i, p in enumerate(prompts[:warmup]):  # kernel compilation: not timed
                generate(server.url, p["input_ids"], 8, f"eyrie-warmup-{name}-{i}")
            return {
                "ready_seconds": server.ready_s,
                **measure(server.url, prompts, max_new_tokens, name, tokenizer),
            }
    except ServerError as exc:
        raise OnlineError(str(exc)) from None


def _run_mode(
    target_dir, draft_dir, prompts, drafts, *, max_new_tokens, log_dir, launch_timeout,
    server_args, launcher, warmup, tokenizer=None,
) -> dict:  # fmt: skip
    def command(port: int, draft=None, s=drafts[0]) -> list[str]:
        return server_command(
            target_dir,
            port,
            draft_path=draft,
            draft_tokens=s["draft_tokens"],
            topk=s["topk"],
            verify_tokens=s["verify_tokens"],
            server_args=server_args,
            launcher=launcher,
            algorithm=s["algorithm"],
        )

    serve = dict(launch_timeout=launch_timeout, prompts=prompts, max_new_tokens=max_new_tokens,
                 warmup=warmup, tokenizer=tokenizer)  # fmt: skip
    plain = _serve(command, log_dir / "sglang-plain.log", name="plain", **serve)
    rows = []
    for s in drafts:
        algo = s["algorithm"].lower()
        name = algo if len(drafts) == 1 else f"{algo}-{setting_name(s)}"

        def spec_command(port: int, s=s) -> list[str]:
            return command(port, draft=draft_dir, s=s)

        try:
            spec = _serve(spec_command, log_dir / f"sglang-{name}.log", name=name, **serve)
        except OnlineError as exc:
            if s["algorithm"] != "NGRAM" or not rows:
                raise
            # a baseline that did not start (its kernels compile at launch) costs no drafter row
            rows.append({"setting": setting_name(s), **s, "status": "failed", "reason": str(exc),
                         "spec_tokens_per_s": None, "speedup": None, "accept_length": None,
                         "identical": None, "differences": [], "spec": None})  # fmt: skip
            continue
        same = sum(a["output_ids"] == b["output_ids"]
                   for a, b in zip(plain["rows"], spec["rows"], strict=True))  # fmt: skip
        parted = differences(plain["rows"], spec["rows"])
        speedup = None
        if plain["tokens_per_s"] and spec["tokens_per_s"]:
            speedup = spec["tokens_per_s"] / plain["tokens_per_s"]
        rows.append(
            {
                "setting": setting_name(s),
                **s,
                "spec_tokens_per_s": spec["tokens_per_s"],
                "speedup": speedup,
                "accept_length": spec["accept_length"],
                "identical": same,
                "differences": parted,
                "spec": spec,
            }
        )
    head = rows[0]
    return {
        **{k: v for k, v in head.items() if k != "spec"},
        "prompts": len(prompts),
        "turns": plain["turns"],
        "server_args": list(server_args),
        "plain_tokens_per_s": plain["tokens_per_s"],
        "runs": {"plain": plain, "eagle3": head["spec"]},
        "settings": [{k: v for k, v in r.items() if k != "spec"} for r in rows],
        "setting_runs": {run_key(r): r["spec"] for r in rows if r["spec"] is not None},
    }


def main(argv: list[str] | None = None) -> int:
    """``python -m eyrie.evaluate.online``: the measurement without the workflow's config (GPU
    images carry SGLang and transformers, not necessarily Eyrie's other dependencies)."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, help="target model folder (HF, with tokenizer)")
    ap.add_argument("--draft", required=True, help="exported SGLang drafter folder")
    ap.add_argument("--prompts-jsonl", required=True, help="chat JSONL (messages)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--draft-tokens", type=int, default=3)
    ap.add_argument("--launch-timeout", type=float, default=600.0)
    ap.add_argument(
        "--cuda-graph",
        choices=["true", "false", "both"],
        default="true",
        help="true: CUDA graphs (as deployed); false: eager (--disable-cuda-graph); both",
    )
    ap.add_argument("--out", required=True, help="JSON result")
    ap.add_argument("--log-dir", required=True, help="server logs")
    ap.add_argument("server_args", nargs="*", help="after --: flags replacing the defaults")
    args = ap.parse_args(argv)

    from eyrie.common.provenance import machine
    from eyrie.evaluate.loading import load_prompts
    from eyrie.target.load import load_tokenizer

    tokenizer = load_tokenizer(args.target)
    prompts = load_prompts(args.prompts_jsonl, tokenizer, args.prompts)
    try:
        rec = measure_servers(
            args.target,
            args.draft,
            prompts,
            max_new_tokens=args.max_new_tokens,
            draft_tokens=args.draft_tokens,
            log_dir=args.log_dir,
            launch_timeout=args.launch_timeout,
            server_args=args.server_args or DEFAULT_SERVER_ARGS,
            cuda_graph={"true": True, "false": False}.get(args.cuda_graph, args.cuda_graph),
            tokenizer=tokenizer,
        )
    except OnlineError as exc:
        print(f"online SGLang: {exc}", file=sys.stderr)
        return 1
    rec["machine"] = machine()
    atomic.write_json(args.out, rec)
    for mode, m in rec["modes"].items():
        print(
            f"SGLang ({mode}): plain {m['plain_tokens_per_s']:.1f} tok/s | {method_text(m)} "
            f"{m['spec_tokens_per_s']:.1f} tok/s | ratio {m['speedup']:.2f}x | "
            f"spec_accept_length {m['accept_length']} | identical outputs "
            f"{m['identical']}/{m['prompts']} | GPU {rec['machine']['gpu']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
