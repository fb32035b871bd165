"""Generation by an SGLang server: token ids in and out, `batch_size` requests in flight.

The server is the online measurement's plain server (eyrie.sglang.launch: CUDA graphs on,
127.0.0.1, a free port, stopped however the job ends), or one the user runs already
(`regenerate.sglang.url`). Each prompt is one /generate request by token ids with the
stage's sampling settings and the target's end-of-turn ids as stop tokens; SGLang's
`finish_reason` says whether an answer stopped there or at `max_new_tokens`. A request that
still fails after its retries is answered `failed`: its conversation ends there and is counted
(the turn's kind `request_failed`), the others go on.

Sampled regeneration is not reproducible across a resume with this backend (SGLang draws its
own random numbers); greedy is.
"""

from __future__ import annotations

import contextlib
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from eyrie.common.errors import EyrieError
from eyrie.common.hf_config import text_config
from eyrie.regenerate.hf import Answer
from eyrie.sglang import http
from eyrie.sglang.launch import LAUNCHER, ONLINE_SERVER_ARGS, online_command
from eyrie.sglang.server import ServerError, ready_server

if TYPE_CHECKING:
    from eyrie.regenerate.settings import RegenerateSettings


class SglangRegenerateError(EyrieError, RuntimeError):
    """The server could not be started; the message carries its log's tail and the setting."""


class SglangGenerator:
    """Answers prompts through an SGLang server at `url`; `close()` stops a server it started.
    `on_tokens(n)` (when set) hears of each answer's tokens as it arrives."""

    on_tokens = None  # set by the stage for its progress bar

    def __init__(
        self, url: str, *, max_new_tokens: int, temperature: float, concurrency: int,
        stops: list[int], retries: int = 2, timeout: float = 600.0, stack=None,
    ):  # fmt: skip
        self.url = url.rstrip("/")
        self.max_new_tokens, self.temperature = int(max_new_tokens), float(temperature)
        self.concurrency, self.stops = max(1, int(concurrency)), list(stops)
        self.retries, self.timeout = int(retries), float(timeout)
        self._stack = stack or contextlib.ExitStack()

    def generate(self, prompts: list[list[int]]) -> list[Answer]:
        with ThreadPoolExecutor(self.concurrency) as pool:
            return list(pool.map(self._one, prompts))

    def _one(self, ids: list[int]) -> Answer:
        payload = {
            "input_ids": list(map(int, ids)),
            "sampling_params": {
                "temperature": self.temperature,
                "max_new_tokens": self.max_new_tokens,
                "stop_token_ids": self.stops,
                **({"top_p": 1.0, "top_k": -1} if self.temperature > 0 else {}),
            },
        }
        for attempt in range(self.retries + 1):
            try:
                status, text = http.post(f"{self.url}/generate", payload, self.timeout)
            except http.HttpError:
                status, text = None, ""
            if status is not None and http.ok(status):
                answer = self._answer(text)
                if self.on_tokens is not None:
                    self.on_tokens(len(answer.ids))
                return answer
            time.sleep(0.5 * (attempt + 1))
        return Answer([], False, failed=True)

    def _answer(self, text: str) -> Answer:
        out = json.loads(text)
        out = out[0] if isinstance(out, list) else out
        ids = list(out.get("output_ids") or [])
        reason = (out.get("meta_info") or {}).get("finish_reason") or {}
        stopped = reason.get("type") == "stop"
        if stopped and ids and ids[-1] in self.stops:  # the matched stop token, if returned
            ids = ids[:-1]
        return Answer(ids, stopped)

    def close(self) -> None:
        self._stack.close()


def sglang_generator(
    target_path, settings: RegenerateSettings, architecture=None, *,
    log_path="regenerate-sglang.log",
    launcher=LAUNCHER,
):  # fmt: skip
    """(SglangGenerator, tokenizer, the target's position limit), its server ready."""
    from eyrie.target.files import read_config
    from eyrie.target.load import load_tokenizer

    tokenizer = load_tokenizer(target_path)
    config = text_config(read_config(target_path))
    stops = sorted({tokenizer.eos_token_id, *_config_stops(target_path, config)} - {None})
    cfg = settings.sglang
    stack = contextlib.ExitStack()
    url = cfg.url
    if not url:
        flags = list(cfg.server_args or ONLINE_SERVER_ARGS)

        def command(port: int) -> list[str]:
            return online_command(target_path, port, server_args=flags, launcher=launcher)

        timeout = float(cfg.launch_timeout_s)
        key = "regenerate.sglang.launch_timeout_s"
        try:
            server = stack.enter_context(ready_server(command, log_path, timeout, key=key))
        except ServerError as exc:
            stack.close()
            raise SglangRegenerateError(str(exc)) from None
        url = server.url
    gen = SglangGenerator(
        url, max_new_tokens=settings.max_new_tokens, temperature=settings.temperature,
        concurrency=settings.batch_size, stops=stops, stack=stack,
    )  # fmt: skip
    return gen, tokenizer, int(config.get("max_position_embeddings") or 1 << 20)


def _config_stops(target_path, config: dict) -> list[int]:
    """eos ids of config.json and generation_config.json (as HFGenerator's stop_ids)."""
    gen = Path(target_path) / "generation_config.json"
    out = []
    for cfg in (config, json.loads(gen.read_text()) if gen.exists() else {}):
        eos = cfg.get("eos_token_id")
        out += list(eos) if isinstance(eos, list) else [eos]
    return out
