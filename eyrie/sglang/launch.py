"""How Eyrie launches SGLang: the one command-line builder and its flag policy.

Both servers Eyrie starts go through `launch_command`: the capture server of an extract job
(`capture_command`, with the patch's flags last) and the plain and EAGLE-3 servers of the online
measurement (`online_command`). The default flag lists are the ones seen working with SGLang
0.5.12 on one H200; the capture server runs eagerly (the patch's manifest adds the eager and
no-radix-cache flags), the online one with CUDA graphs, as deployed.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from eyrie.sglang.server import ServerError

# The flags both servers start from: no flashinfer/xgrammar dependencies at run time.
_BACKENDS = ["--attention-backend", "triton"]
_NO_GRAMMAR = ["--grammar-backend", "none", "--sampling-backend", "pytorch"]
_MEMORY = ["--mem-fraction-static", "0.5"]
# capture.sglang.server_args: null. The patch's own flags (no radix cache, eager execution,
# token ids in and out) come from the bundle's manifest.
CAPTURE_SERVER_ARGS = [*_BACKENDS, *_NO_GRAMMAR, *_MEMORY]
# evaluate.sglang.server_args: null. CUDA graphs on (the eager mode adds --disable-cuda-graph),
# no piecewise graphs.
ONLINE_SERVER_ARGS = [
    *_BACKENDS,
    "--disable-piecewise-cuda-graph",
    *_NO_GRAMMAR,
    "--tp",
    "1",
    *_MEMORY,
]

# Flags under which hooked states are wrong or cannot be tied to requests.
REFUSED = {
    "--enable-two-batch-overlap": "splits a pass in two sub-batches",
    "--enable-dp-attention": "scatters a pass's tokens over ranks",
    "--speculative-algorithm": "runs draft and verify passes through the target",
    "--enable-torch-compile": "compiled modules do not run Python hooks",
    "--enable-piecewise-cuda-graph": "graph replays do not run Python hooks",
}
# Flags whose value must stay 1: one pipeline stage, one data-parallel replica, one node (the
# dump folder is local: tensor-parallel rank 0 writes it on the job's machine).
SINGLE = (
    "--pp-size",
    "--pipeline-parallel-size",
    "--dp-size",
    "--dp",
    "--data-parallel-size",
    "--nnodes",
)
OWNED = ("--host", "--port", "--model-path", "--tp", "--tp-size", "--forward-hooks")


def launcher(python: str | None = None) -> list[str]:
    """The launch_server module run by `python` (this interpreter by default)."""
    return [python or sys.executable, "-m", "sglang.launch_server"]


LAUNCHER = launcher()


def launch_command(
    model_path,
    port: int,
    *,
    launcher: Sequence[str] | None = None,
    before: Sequence[str] = (),
    flags: Sequence[str] = (),
) -> list[str]:
    """launcher --model-path M [before] --host 127.0.0.1 --port P [flags]."""
    cmd = [*(launcher or LAUNCHER), "--model-path", str(model_path), *before]
    return cmd + ["--host", "127.0.0.1", "--port", str(port), *flags]


def check_server_args(args: list[str]) -> None:
    """Refuse configured flags that break capture, or that the job sets itself."""
    for i, arg in enumerate(args):
        name, _, inline = arg.partition("=")
        if name in REFUSED:
            raise ServerError(
                f"capture.sglang.server_args: {name} {REFUSED[name]}, which capture cannot "
                "follow; remove it"
            )
        if name in OWNED:
            raise ServerError(
                f"capture.sglang.server_args: {name} is set by the extract job itself "
                "(use capture.sglang.tp for the tensor-parallel size); remove it"
            )
        if name in SINGLE:
            value = inline or (args[i + 1] if i + 1 < len(args) else "")
            if value != "1":
                raise ServerError(
                    f"capture.sglang.server_args: {name} {value}: capture supports one "
                    "pipeline stage, one data-parallel replica and one node per server (the "
                    "dump folder is local to the job's machine, where tensor-parallel rank 0 "
                    "writes it); use 1"
                )


def capture_command(
    model_path,
    port: int,
    *,
    launcher: list[str] | None = None,
    tp: int = 1,
    chunked_prefill_size: int | None = None,
    dtype: str | None = None,
    server_args: list[str] | None = None,
    patch_args: list[str] | None = None,
) -> list[str]:
    """The capture server's command line: ours first, then the configured flags, then the
    patch's. Configured flags that break capture are refused (ServerError)."""
    extra = list(CAPTURE_SERVER_ARGS if server_args is None else server_args)
    check_server_args(extra)
    ours = ["--tp", str(int(tp))]
    if chunked_prefill_size:
        ours += ["--chunked-prefill-size", str(int(chunked_prefill_size))]
    if dtype and dtype != "auto":
        ours += ["--dtype", dtype]
    flags = [*ours, *extra, *(patch_args or [])]
    return launch_command(model_path, port, launcher=launcher, flags=flags)


def online_command(
    model_path,
    port: int,
    *,
    draft_path=None,
    draft_tokens: int = 3,
    topk: int = 1,
    verify_tokens: int | None = None,
    server_args: Sequence[str] = ONLINE_SERVER_ARGS,
    launcher: Sequence[str] = LAUNCHER,
    algorithm: str = "EAGLE3",
) -> list[str]:
    """The online server's command; with `draft_path`, EAGLE-3 with `draft_tokens` draft steps:
    a chain by default, a tree of `topk` branches per step verifying `verify_tokens` tokens
    (SGLang's --speculative-num-draft-tokens; a chain verifies draft_tokens + 1). With
    `algorithm` DFLASH, a DFlash block of draft_tokens + 1 (its drafts are one chain). With
    `algorithm` NGRAM, no drafter: SGLang drafts by lookup in the context (its trie and BFS
    over matches), verifying `verify_tokens` (draft_tokens + 1 by default) per pass."""
    flags = list(server_args)
    if algorithm == "NGRAM":
        verify = verify_tokens or draft_tokens + 1
        flags += ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(verify)]
    elif draft_path is not None and algorithm == "DFLASH":
        flags += [
            "--speculative-algorithm",
            "DFLASH",
            "--speculative-draft-model-path",
            str(draft_path),
            "--speculative-num-draft-tokens",
            str(draft_tokens + 1),
        ]
    elif draft_path is not None:
        if topk < 1 or draft_tokens < 1:
            raise ServerError(
                f"EAGLE-3 needs at least one draft step and topk >= 1 (got {draft_tokens} steps, "
                f"topk {topk})"
            )
        verify = draft_tokens + 1 if topk == 1 else verify_tokens
        if verify is None or (topk == 1 and verify_tokens not in (None, verify)):
            raise ServerError(
                f"a chain of {draft_tokens} drafts verifies {draft_tokens + 1} tokens; a tree "
                f"(topk {topk}) needs verify_tokens: got {verify_tokens}"
            )
        flags += [
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-draft-model-path",
            str(draft_path),
            "--speculative-num-steps",
            str(draft_tokens),
            "--speculative-eagle-topk",
            str(topk),
            "--speculative-num-draft-tokens",
            str(verify),
        ]
    before = ["--skip-tokenizer-init"]
    return launch_command(model_path, port, launcher=launcher, before=before, flags=flags)
