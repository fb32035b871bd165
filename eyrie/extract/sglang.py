"""The SGLang backend of the extract job: token ids to a patched server, dumps to a store.

Each sample goes out as one request: its token ids, rid = the job's prefix + the sample id, and
max_new_tokens 1 (a prefill and one sampled token), a bounded number at a time (threads). The
patch in the server (eyrie/sglang/patch) writes the request's states to the dump folder, and
eyrie.extract.dumps joins and checks them. Before a request goes out the client waits while the
dump folder holds more than capture.sglang.max_dump_bytes. While it waits for answers, the
server is watched (eyrie.extract.sglang_faults): a server that dies, hangs or answers errors
stops the job within seconds, with one message naming the server, the shard and the next step.

Everything around the capture is the extract job's (eyrie.extract.job): shard membership,
tokenization, commit groups, errors table, resume and provenance. The store gets the same arrays
and attributes as with the transformers backend; only the provenance says backend "sglang", so
validate and training cannot tell the backends apart.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from eyrie.common.hf_config import text_config
from eyrie.common.provenance import file_sha256
from eyrie.extract.dumps import DumpFolder, SglangError
from eyrie.extract.job import Prepared, work_paths
from eyrie.extract.sglang_faults import Place, Watch, read_answer, request_failed
from eyrie.sglang.http import HttpError, Inflight, get_status, post_json
from eyrie.sglang.launch import capture_command, launcher
from eyrie.sglang.patch import protocol as proto
from eyrie.sglang.patch.bundle import check_installed, installed_package, server_args, server_env
from eyrie.sglang.patch.manifest import load_manifest
from eyrie.sglang.patch.settings import PatchError, defaults, sglang_settings
from eyrie.sglang.server import ServerError, ready_server

log = logging.getLogger("eyrie.sglang")

STATES_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def client_threads(concurrency: int) -> int:
    """The client's threads for `concurrency` requests in flight: those, and readers of dumps."""
    return concurrency + max(2, concurrency // 2)


POLL_S = 0.2  # how often the job's thread, waiting for answers, looks at the server's state

__all__ = ["DumpFolder", "SglangBackend", "SglangCapture", "SglangError", "patched_server"]


def settings_of(capture: dict) -> dict:
    try:
        return sglang_settings(capture)
    except PatchError as exc:
        raise SglangError(str(exc)) from None


# ---------------------------------------------------------------------------------------------
# requests


def prefill_request(rid: str, input_ids) -> dict:
    """The /generate body of a capture: the prompt's token ids under our rid, one new token."""
    return {
        "input_ids": [int(i) for i in input_ids],
        "rid": rid,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
    }


class SglangCapture:
    """Captures samples through a patched server, a bounded number of requests at a time.

    `place` names the server and the shard in fault messages (by default the server alone).
    """

    def __init__(
        self,
        url: str,
        folder: DumpFolder,
        settings: dict,
        rid_prefix: str,
        *,
        place: Place | None = None,
    ):
        self.url = url.rstrip("/")
        self.folder = folder
        self.rid_prefix = rid_prefix
        self.concurrency = int(settings["concurrency"])
        self.request_timeout = float(settings["request_timeout_s"])
        self.dump_timeout = float(settings["dump_timeout_s"])
        self.max_bytes = int(settings["max_dump_bytes"])
        self.dtype = settings["dtype"]
        health = settings.get("health_timeout_s") or defaults()["health_timeout_s"]
        server = folder.server  # the launched SglangServer; None for an external one
        log = folder.server_log if server is not None else None
        place = place or Place(self.url, dump_dir=folder.path, bundle=folder.bundle)
        self.place = replace(place, url=self.url, log=log)
        self.inflight = Inflight()
        self.watch = Watch(self.place, server, float(health), on_fault=self.inflight.cancel)
        # `concurrency` requests in flight at the server; a thread that has its answer gives
        # its slot up before it reads the dumps, so reading never leaves the server short of
        # work (the threads beyond `concurrency` are the ones reading)
        self.slots = threading.Semaphore(self.concurrency)
        self.pool = ThreadPoolExecutor(
            client_threads(self.concurrency), thread_name_prefix="eyrie-sglang"
        )
        self.refused: list[str] = []  # rids answered with an error: their dumps may land late

    def close(self) -> None:
        """Stop: queued requests are dropped, requests in flight cut, waiting threads give up.
        The refused requests' dumps are removed again: the patch writes a pass's files from a
        thread of its own, so one may land after the error answer that removed the first ones."""
        self.folder.closed = True
        self.watch.close()
        self.inflight.cancel()
        self.pool.shutdown(wait=False, cancel_futures=True)
        if self.refused:
            time.sleep(0.2)
            for rid in self.refused:
                self.folder.clear(rid)

    def _room(self) -> None:
        t0 = time.monotonic()
        while self.folder.nbytes_recent() > self.max_bytes:
            if self.folder.closed:
                raise SglangError("the job is stopping")
            if time.monotonic() - t0 > self.request_timeout:
                raise SglangError(
                    f"the dump folder {self.folder.path} has held more than "
                    f"capture.sglang.max_dump_bytes ({self.max_bytes}) for "
                    f"{self.request_timeout:.0f} s; files are written there that this job does "
                    "not consume (another job or server using the same folder?)"
                )
            time.sleep(0.05)
        self.folder.stats.waited_s += time.monotonic() - t0

    def one(self, sample_id: str, input_ids: np.ndarray):
        """(aux, final) of one sample, or ("error", reason, detail) for a refused sample."""
        rid = f"{self.rid_prefix}{sample_id}"
        self._room()
        if self.folder.external:  # a shared folder may hold an earlier attempt's files
            self.folder.clear(rid)
        try:
            with self.slots:
                status, body = post_json(
                    f"{self.url}/generate",
                    prefill_request(rid, input_ids),
                    self.request_timeout,
                    inflight=self.inflight,
                )
        except HttpError as exc:
            if self.inflight.cancelled:  # the job stops for a fault found elsewhere
                raise SglangError("the job is stopping") from None
            raise request_failed(self.watch, exc, sample_id, self.request_timeout) from None
        if isinstance(body, list):
            body = body[0] if body else {}
        verdict = read_answer(self.place, sample_id, status, body)
        if verdict is not None:
            self.folder.clear(rid)  # what the server dumped before it failed or refused
            self.refused.append(rid)
            if isinstance(verdict, SglangError):
                raise verdict
            return verdict
        if "output_ids" not in body:
            raise SglangError(
                f"{self.url}/generate answered without output_ids (keys {sorted(body)}); the "
                "server must run with --skip-tokenizer-init"
            )
        meta = body.get("meta_info") or {}
        if meta.get("cached_tokens"):
            raise SglangError(
                f"the server reused {meta['cached_tokens']} cached tokens of sample "
                f"{sample_id!r}: their states were never computed. Start it with "
                "--disable-radix-cache"
            )
        if meta.get("prompt_tokens") not in (None, len(input_ids)):
            raise SglangError(
                f"the server read {meta['prompt_tokens']} prompt tokens of sample {sample_id!r}, "
                f"not {len(input_ids)}; a server started with --allow-auto-truncate cuts long "
                "prompts: start it without"
            )
        aux, final = self.folder.collect(rid, input_ids, self.dump_timeout)
        want = STATES_DTYPES.get(self.dtype)
        if want is not None and (aux.dtype != want or final.dtype != want):
            raise SglangError(
                f"the server computes in {aux.dtype}, capture.sglang.dtype is {self.dtype}; "
                "set capture.sglang.dtype to match the server (or 'auto')"
            )
        return aux, final

    def capture(self, samples: list[tuple[str, np.ndarray]]) -> list:
        """one() for each (sample_id, input_ids), in order.

        The first failure, or a fault of the server seen meanwhile (a dead process, no answer
        to /health), stops the rest: queued requests are dropped and those in flight cut."""
        self.watch.start()
        futures = [self.pool.submit(self.one, sid, ids) for sid, ids in samples]
        pending = set(futures)
        try:
            while pending:
                _, pending = wait(pending, timeout=POLL_S, return_when=FIRST_EXCEPTION)
                failed = [f for f in futures if f.done() and not f.cancelled() and f.exception()]
                if failed or pending:
                    self.watch.check(len(pending))  # a server's fault explains any failure
                if failed:
                    raise failed[0].exception()
        except BaseException:
            self.close()
            raise
        return [f.result() for f in futures]


# ---------------------------------------------------------------------------------------------
# the server


def _dump_folder(s: dict) -> tuple[Path, bool]:
    """(the dump folder, whether it was made for this job and is removed after it)."""
    if s["dump_dir"]:
        return proto.ensure_private_dir(s["dump_dir"]), False
    root = Path(s["dump_root"])
    if not root.is_dir():
        fallback = Path(tempfile.gettempdir())
        log.warning("capture.sglang.dump_root %s does not exist; using %s", root, fallback)
        root = fallback
    return Path(tempfile.mkdtemp(prefix="eyrie-dump-", dir=root)), True  # mode 0700


def external_ready(url: str, timeout: float, bundle: Path, dump_dir: Path) -> None:
    """Wait until an external server answers GET /health with 200; a busy one may answer 503
    (SGLang's /health waits for its scheduler), so it gets capture.sglang.health_timeout_s."""
    deadline, why = time.monotonic() + timeout, "no answer"
    while True:
        status, no_answer = get_status(f"{url}/health", timeout=max(1.0, min(30.0, timeout)))
        if status == 200:
            return
        why = no_answer or f"HTTP {status}"
        if no_answer == "connection refused" or time.monotonic() > deadline:
            raise SglangError(
                f"the SGLang server at {url} (capture.sglang.url) does not answer GET /health "
                f"with 200 ({why}); start it with {bundle}/launch.sh MODEL_DIR PORT and "
                f"EYRIE_PATCH_DUMP_DIR={dump_dir}, or set capture.sglang.url to a running one"
            )
        time.sleep(1.0)


PROBE_IDS = np.array([0, 1], dtype=np.int64)  # token ids every vocabulary has


def probe_dump(url: str, folder: DumpFolder, rid_prefix: str, timeout: float) -> None:
    """One two-token request whose dump must come back: proves that the server at `url` runs
    the patch and writes into this job's folder now (its status files may be a dead server's)."""
    rid = f"{rid_prefix}probe-{uuid.uuid4().hex[:12]}"
    try:
        status, body = post_json(
            f"{url}/generate", prefill_request(rid, PROBE_IDS), timeout=max(timeout, 30.0)
        )
    except HttpError as exc:
        raise SglangError(f"the SGLang server at {url} failed a probe request: {exc}") from None
    if status != 200:
        raise SglangError(f"the SGLang server at {url} answered a probe request with {status}: "
                          f"{str(body)[:300]}")  # fmt: skip
    try:
        folder.collect(rid, PROBE_IDS, timeout=min(timeout, 10.0))
    except SglangError as exc:
        pids = [s.get("pid") for s in folder.statuses()]
        raise SglangError(
            f"the SGLang server at {url} answers, but no dump of a probe request reached "
            f"{folder.path} ({exc}). The status files there (pids {pids}) may be an earlier "
            f"server's: this one runs without the patch or writes elsewhere. {folder.where()}"
        ) from None


@contextlib.contextmanager
def patched_server(
    *,
    bundle: Path,
    manifest: dict,
    target_path,
    settings: dict,
    rid_prefix: str,
    log_path: Path,
    base_env: dict | None = None,
):
    """(url, DumpFolder) of a patched server: launched here, or the external one configured.

    `base_env` is the environment the launched server's starts from (this process's by default).
    """
    manifest_sha = file_sha256(bundle / "manifest.json")
    external = bool(settings["url"])
    if external and not settings["dump_dir"]:
        raise SglangError(
            "capture.sglang.url is set but capture.sglang.dump_dir is not: an external server "
            "writes its dumps into the folder given at its start; set dump_dir to that folder"
        )
    path, private = _dump_folder(settings)
    folder = DumpFolder(path, manifest_sha, bundle, external=external, server_log=log_path)
    try:
        if external:
            url = settings["url"].rstrip("/")
            health = settings.get("health_timeout_s") or defaults()["health_timeout_s"]
            external_ready(url, float(health), bundle, path)
            folder.check_loaded(manifest["mechanism"], rid_prefix, wait_s=2.0)
            stale = folder.sweep(float(settings["request_timeout_s"] + settings["dump_timeout_s"]))
            if stale:
                log.info("removed %d files an earlier server or job left in %s", stale, path)
            probe_dump(url, folder, rid_prefix, float(settings["dump_timeout_s"]))
            yield url, folder
            return
        python = settings["python"] or sys.executable
        env = server_env(bundle, manifest, path, rid_prefix, base_env)
        try:
            check_installed(manifest, installed_package(python, env))
        except RuntimeError as exc:
            raise SglangError(str(exc)) from None
        run = settings["launcher"] or launcher(python)

        def command(port: int) -> list[str]:
            return capture_command(
                target_path,
                port,
                launcher=list(run),
                tp=int(settings["tp"]),
                chunked_prefill_size=settings["chunked_prefill_size"],
                dtype=settings["dtype"],
                server_args=settings["server_args"],
                patch_args=server_args(bundle, manifest, path, rid_prefix),
            )

        command(0)  # refuses bad configured flags (ServerError) before anything starts
        try:
            timeout = float(settings["launch_timeout_s"])
            with ready_server(command, log_path, timeout, env=env) as server:
                log.info(
                    "SGLang ready on %s after %.0f s (log %s)", server.url, server.ready_s, log_path
                )
                folder.server = server
                try:
                    folder.check_loaded(manifest["mechanism"], rid_prefix)
                except SglangError as exc:
                    raise server.failure(str(exc)) from None
                yield server.url, folder
        except ServerError as exc:
            raise SglangError(str(exc)) from None
    finally:
        if private:
            shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
# the backend


class SglangBackend:
    """The extract job's capture (eyrie.extract.job.Capture) through a patched SGLang server.

    The bundle and its manifest are checked first; the server starts only when some commit
    group is left to capture. Groups are written on the job's thread as their dumps arrive.
    """

    backend, label = "sglang", " (sglang)"
    seconds_keys = ("setup", "capture", "write", "total")
    writer_queue = 0

    def __init__(self, capture: dict, *, split: str, shard: int, out_store, errors_csv,
                 architecture=None, target=None):  # fmt: skip
        self.s = settings_of(capture)
        if not self.s["bundle"]:
            raise SglangError(
                "capture.sglang.bundle is not set: give the folder patch_server wrote "
                "(results/patch in the workflow; `eyrie patch-server` outside it)"
            )
        self.bundle = Path(self.s["bundle"])
        try:
            self.manifest = load_manifest(self.bundle)
        except PatchError as exc:
            raise SglangError(str(exc)) from None
        self.architecture, self.target = architecture, target
        self.rid_prefix = f"{self.s['rid_prefix']}{split}.{shard:03d}:"
        self.shard_label = f"{split}/{shard:03d}"
        self.work_store = work_paths(out_store, errors_csv)[0]  # where the commits are
        log_dir = Path(self.s["log_dir"]) if self.s["log_dir"] else Path(errors_csv).parent
        self.server_log = log_dir / f"{Path(out_store).stem}.sglang.log"
        self.target_path = None
        self.stats = None

    def prepare(self, target_path, aux_ids: list[int]) -> Prepared:
        from eyrie.target.load import load_tokenizer, read_architecture, read_config

        bundle, manifest, s = self.bundle, self.manifest, self.s
        if aux_ids != manifest["aux_layer_ids"]:
            raise SglangError(
                f"the patch bundle {bundle} captures aux layers {manifest['aux_layer_ids']}, the "
                f"config asks for {aux_ids}; rerun verify_env and patch_server"
            )
        arch = read_architecture(target_path, self.architecture)
        if arch != manifest["architecture"]:
            raise SglangError(
                f"the patch bundle {bundle} was verified for {manifest['architecture']}, the "
                f"target is {arch}; rerun verify_env and patch_server"
            )
        self.target_path = target_path
        t = self.target
        tokenizer = t.tokenizer if t is not None else load_tokenizer(target_path)
        sglang = {
            "version": manifest["sglang"]["version"],
            "mechanism": manifest["mechanism"],
            "manifest_sha256": file_sha256(bundle / "manifest.json"),
        }
        return Prepared(
            tokenizer,
            arch,
            torch.device("cuda"),
            STATES_DTYPES.get(s["dtype"], torch.bfloat16),
            hidden_size(read_config(target_path)),
            settings={"sglang": sglang},
            dtype_label="auto" if s["dtype"] == "auto" else None,
        )

    @contextlib.contextmanager
    def session(self, todo: bool, batch_size: int):
        if not todo:
            yield None
            return
        with patched_server(
            bundle=self.bundle,
            manifest=self.manifest,
            target_path=self.target_path,
            settings=self.s,
            rid_prefix=self.rid_prefix,
            log_path=self.server_log,
        ) as (url, folder):
            self.stats = folder.stats
            place = Place(
                url,
                shard=self.shard_label,
                store=self.work_store,
                dump_dir=folder.path,
                bundle=self.bundle,
            )
            cap = SglangCapture(url, folder, self.s, self.rid_prefix, place=place)
            try:

                def submit(group):
                    results = cap.capture([(g.sample_id, g.input_ids) for g in group])
                    return lambda: results

                yield submit
            finally:
                cap.close()

    def finish(self, outcome) -> None:
        stats = self.stats
        if stats is None:
            return
        outcome.seconds["dump_wait"] = stats.waited_s
        log.info(
            "sglang: %d requests, %d tokens, %d chunks; %d requests in more than one pass "
            "(up to %d)",
            stats.requests,
            stats.tokens,
            stats.chunks,
            stats.chunked,
            stats.max_chunks,
        )


def hidden_size(config: dict) -> int:
    """hidden_size of a config.json, at its top or in its text_config (a wrapper's)."""
    for cfg in (config, text_config(config)):
        if isinstance(cfg.get("hidden_size"), int):
            return int(cfg["hidden_size"])
    raise SglangError("the target's config.json has no hidden_size")
