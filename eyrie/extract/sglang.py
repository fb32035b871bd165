"""The SGLang backend of the extract stage: token ids to a patched server, dumps to a store.

Each sample goes out as one request: its token ids, rid = the job's prefix + the sample id, and
max_new_tokens 1 (a prefill and one sampled token), a bounded number at a time (threads). The
patch in the server (eyrie/sglang_patch) writes the request's states to the dump folder, one
file per prefill chunk; the client joins the chunks by their prefix length, checks them (the
chunks cover the prompt exactly, the server saw our token ids at positions 0..T-1), deletes them
and keeps the states in memory until the commit group is written. Before a request goes out the
client waits while the dump folder holds more than capture.sglang.max_dump_bytes.

Everything around the capture is the transformers backend's own code (eyrie.extract.shard): shard
membership, tokenization, commit groups, errors table, resume and provenance. The store gets the
same arrays and attributes; only the provenance says backend "sglang", so validate and training
cannot tell the backends apart.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from eyrie.common.disk_full import for_extract, is_disk_full
from eyrie.extract.shard import ExtractError
from eyrie.sglang.patch import dump as proto
from eyrie.store.lock import StoreLock

log = logging.getLogger("eyrie.sglang")

STATES_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class SglangError(ExtractError):
    """The server or its patch did not deliver what the protocol promises; says what to fix."""


def settings_of(capture: dict) -> dict:
    from eyrie.sglang.patch.bundle import PatchError, sglang_settings

    try:
        return sglang_settings(capture)
    except PatchError as exc:
        raise SglangError(str(exc)) from None


# ---------------------------------------------------------------------------------------------
# HTTP


def post_json(url: str, payload: dict, timeout: float) -> tuple[int, dict]:
    """(status, body) of a JSON POST; connection failures raise SglangError."""
    req = urllib.request.Request(
        url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read().decode() or "{}")
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")
        try:
            return exc.code, json.loads(body)
        except ValueError:
            return exc.code, {"error": body[:500]}
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise SglangError(f"POST {url} failed: {exc}") from None


# ---------------------------------------------------------------------------------------------
# the dump folder


@dataclass
class Stats:
    requests: int = 0
    tokens: int = 0
    chunks: int = 0
    chunked: int = 0  # requests that arrived in more than one pass
    max_chunks: int = 0
    waited_s: float = 0.0  # time spent waiting for room in the dump folder

    def add(self, tokens: int, chunks: int) -> None:
        self.requests += 1
        self.tokens += tokens
        self.chunks += chunks
        self.chunked += chunks > 1
        self.max_chunks = max(self.max_chunks, chunks)


@dataclass
class DumpFolder:
    """The client's side of the dump protocol (eyrie/sglang/patch/dump.py)."""

    path: Path
    manifest_sha256: str
    bundle: Path
    external: bool = False
    server_log: Path | None = None
    server: object = None  # the launched SglangServer, for its log when it dies
    stats: Stats = field(default_factory=Stats)
    closed: bool = False  # set when the job stops: waiting threads give up at once

    def nbytes(self) -> int:
        total = 0
        with os.scandir(self.path) as it:
            for entry in it:
                with contextlib.suppress(OSError):
                    total += entry.stat().st_size
        return total

    def statuses(self) -> list[dict]:
        out = []
        for p in sorted(self.path.glob(f"{proto.STATUS_PREFIX}*.json")):
            with contextlib.suppress(OSError, ValueError):
                out.append(json.loads(p.read_text()))
        return out

    def clear(self, rid: str) -> None:
        """Remove a rid's files left by an earlier attempt (an external server's folder)."""
        key = proto.rid_key(rid)
        for p in self.path.glob(f"{key}.*"):
            p.unlink(missing_ok=True)

    def where(self) -> str:
        if self.external:
            return (
                f"start the server with {self.bundle}/launch.sh and "
                f"EYRIE_PATCH_DUMP_DIR={self.path}"
            )
        return f"see the server log {self.server_log}"

    def check_loaded(self, mechanism: str, rid_prefix: str, wait_s: float = 10.0) -> list[dict]:
        """The status files of this bundle's patch; SglangError when it is not loaded."""
        deadline = time.monotonic() + wait_s
        while True:
            statuses = self.statuses()
            errors = [s["install_error"] for s in statuses if s.get("install_error")]
            if errors:
                raise SglangError(f"{errors[0]} ({self.where()})")
            bad = [s for s in statuses if s.get("files_ok") is False]
            if bad:
                raise SglangError(
                    f"the server's SGLang differs from the verified one: {bad[0]['mismatch']}; "
                    "rerun verify_env and patch_server where the server runs"
                )
            ours = [s for s in statuses if s.get("manifest_sha256") == self.manifest_sha256]
            if ours:
                keeps = [s for s in ours if rid_prefix.startswith(s.get("rid_prefix") or "\0")]
                if not keeps:
                    raise SglangError(
                        f"the server keeps requests whose rid starts with "
                        f"{ours[0].get('rid_prefix')!r}; this job sends {rid_prefix!r}: set "
                        "capture.sglang.rid_prefix to the server's"
                    )
                return ours
            if time.monotonic() > deadline:
                other = " (it holds status files of another bundle)" if statuses else ""
                raise SglangError(
                    f"the server answers but Eyrie's capture patch ({mechanism}) is not loaded "
                    f"in it: no status file of {self.bundle}/manifest.json in {self.path}{other}; "
                    f"{self.where()}"
                )
            time.sleep(0.2)

    def _error(self, rid: str) -> dict | None:
        p = self.path / proto.error_name(rid)
        if not p.is_file():
            return None
        with contextlib.suppress(OSError, ValueError):
            return json.loads(p.read_text())
        return {"reason": "unreadable", "detail": str(p)}

    def _chunks(self, key: str) -> dict[int, Path]:
        out = {}
        for p in self.path.glob(f"{key}.*{proto.CHUNK_SUFFIX}"):
            parsed = proto.parse_chunk_name(p.name)
            if parsed and parsed[0] == key:
                out[parsed[1]] = p
        return out

    def collect(self, rid: str, input_ids: np.ndarray, timeout: float):
        """The request's (aux (T, k, H), final (T, H)), its chunks checked, joined and deleted."""
        from safetensors import safe_open

        key, total = proto.rid_key(rid), len(input_ids)
        deadline, delay = time.monotonic() + timeout, 0.002
        lengths: dict[int, int] = {}
        while True:
            err = self._error(rid)
            if err is not None:
                raise SglangError(
                    f"the server could not capture sample {rid!r}: {err.get('reason')}: "
                    f"{err.get('detail')}"
                )
            chunks = self._chunks(key)
            for prefix, path in chunks.items():
                if prefix not in lengths:
                    with safe_open(str(path), framework="pt") as f:
                        lengths[prefix] = int(f.metadata()["tokens"])
            order, at = [], 0
            while at in lengths and at < total:
                order.append(at)
                at += lengths[at]
            if at == total and set(order) == set(chunks):
                break
            if at > total or (at == total and set(order) != set(chunks)):
                raise SglangError(
                    f"the dumps of sample {rid!r} do not tile its {total} tokens (chunks at "
                    f"{sorted(lengths.items())}); the server computed another prompt"
                )
            if time.monotonic() > deadline:
                raise SglangError(self._missing(rid, total, lengths))
            if self.closed:
                raise SglangError("the job is stopping")
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        aux, final, ids, pos = [], [], [], []
        for prefix in order:
            with safe_open(str(chunks[prefix]), framework="pt") as f:
                meta = f.metadata()
                if meta.get("rid") != rid or int(meta.get("prefix", -1)) != prefix:
                    raise SglangError(
                        f"{chunks[prefix]} holds rid {meta.get('rid')!r} prefix "
                        f"{meta.get('prefix')}, not {rid!r} at {prefix}"
                    )
                aux.append(f.get_tensor("aux"))
                final.append(f.get_tensor("final"))
                names = set(f.keys())
                ids.append(f.get_tensor("input_ids") if "input_ids" in names else None)
                pos.append(f.get_tensor("positions") if "positions" in names else None)
        for path in chunks.values():
            path.unlink(missing_ok=True)
        aux_t, final_t = torch.cat(aux), torch.cat(final)
        if all(i is not None for i in ids):
            seen = torch.cat(ids).numpy()
            if not np.array_equal(seen, np.asarray(input_ids, dtype=np.int64)):
                bad = int(np.argmax(seen != np.asarray(input_ids, dtype=np.int64)))
                raise SglangError(
                    f"the server computed other token ids for sample {rid!r} (first difference "
                    f"at token {bad}): the dumps belong to another prompt"
                )
        if all(p is not None for p in pos):
            if not torch.equal(torch.cat(pos), torch.arange(total, dtype=torch.int64)):
                raise SglangError(
                    f"the dumps of sample {rid!r} sit at positions other than 0..{total - 1}"
                )
        self.stats.add(total, len(order))
        return aux_t, final_t

    def _missing(self, rid: str, total: int, lengths: dict) -> str:
        if lengths:
            return (
                f"the dumps of sample {rid!r} cover only {sorted(lengths.items())} of its "
                f"{total} tokens after the server answered; {self.where()}"
            )
        statuses = [s for s in self.statuses() if s.get("manifest_sha256") == self.manifest_sha256]
        if not statuses:
            return (
                f"the server answered sample {rid!r} but wrote no dump and Eyrie's patch is not "
                f"loaded in it (no status file in {self.path}); {self.where()}"
            )
        problems = sorted({p for s in statuses for p in s.get("problems", [])})
        hint = f" Problems it reported: {'; '.join(problems)}." if problems else ""
        return (
            f"the server answered sample {rid!r} but its hooks captured nothing for it (patch "
            f"loaded in pids {[s.get('pid') for s in statuses]}).{hint} The hooked modules did "
            "not run: a hook spec matched no module ('No modules matched' in the server log), "
            f"or the pass ran in a CUDA graph or compiled region; {self.where()}"
        )


# ---------------------------------------------------------------------------------------------
# capture


class SglangCapture:
    """Captures samples through a patched server, a bounded number of requests at a time."""

    def __init__(self, url: str, folder: DumpFolder, settings: dict, rid_prefix: str):
        self.url = url.rstrip("/")
        self.folder = folder
        self.rid_prefix = rid_prefix
        self.concurrency = int(settings["concurrency"])
        self.request_timeout = float(settings["request_timeout_s"])
        self.dump_timeout = float(settings["dump_timeout_s"])
        self.max_bytes = int(settings["max_dump_bytes"])
        self.dtype = settings["dtype"]
        self.pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="eyrie-sglang")

    def close(self) -> None:
        """Stop: queued requests are dropped, threads still waiting give up."""
        self.folder.closed = True
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _room(self) -> None:
        t0 = time.monotonic()
        while self.folder.nbytes() > self.max_bytes:
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
        self.folder.clear(rid)
        payload = {
            "input_ids": [int(i) for i in input_ids],
            "rid": rid,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        }
        try:
            status, body = post_json(f"{self.url}/generate", payload, self.request_timeout)
        except SglangError as exc:
            server = self.folder.server
            if server is not None and not server.alive():
                raise server.failure(f"{exc}; the SGLang server died") from None
            raise
        if isinstance(body, list):
            body = body[0] if body else {}
        if status >= 500:
            raise SglangError(f"the server failed on sample {sample_id!r} ({status}): {body}")
        if status != 200:
            detail = body.get("error") or body.get("message") or body.get("detail") or body
            self.folder.clear(rid)
            return ("error", "server_rejected", f"HTTP {status}: {str(detail)[:300]}")
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
                f"not {len(input_ids)}"
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
        """one() for each (sample_id, input_ids), in order; the first failure stops the rest."""
        futures = [self.pool.submit(self.one, sid, ids) for sid, ids in samples]
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for f in futures:
            if f.done() and f.exception() is not None:
                for other in pending:
                    other.cancel()
                raise f.exception()
        return [f.result() for f in futures]


# ---------------------------------------------------------------------------------------------
# the extract job


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


@contextlib.contextmanager
def patched_server(
    *,
    bundle: Path,
    manifest: dict,
    target_path,
    settings: dict,
    rid_prefix: str,
    log_path: Path,
):
    """(url, DumpFolder) of a patched server: launched here, or the external one configured."""
    from eyrie.sglang.patch.bundle import (
        check_installed,
        installed_package,
        server_args,
        server_env,
    )
    from eyrie.sglang.server import ServerError, launch_command, ready_server

    manifest_sha = proto.sha256_file(bundle / "manifest.json")
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
            from eyrie.sglang.server import http_ok

            if not http_ok(f"{url}/health", timeout=30):
                raise SglangError(f"the server at {url} does not answer GET /health")
            folder.check_loaded(manifest["mechanism"], rid_prefix, wait_s=2.0)
            yield url, folder
            return
        python = settings["python"] or sys.executable
        env = server_env(bundle, manifest, path, rid_prefix)
        try:
            check_installed(manifest, installed_package(python, env))
        except RuntimeError as exc:
            raise SglangError(str(exc)) from None
        launcher = settings["launcher"] or [python, "-m", "sglang.launch_server"]

        def command(port: int) -> list[str]:
            return launch_command(
                target_path,
                port,
                launcher=list(launcher),
                tp=int(settings["tp"]),
                chunked_prefill_size=settings["chunked_prefill_size"],
                dtype=settings["dtype"],
                server_args=settings["server_args"],
                patch_args=server_args(bundle, manifest, path, rid_prefix),
            )

        command(0)  # refuses bad configured flags before anything starts
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


def extract_shard_sglang(
    *,
    data_path,
    target_path,
    split: str,
    shard: int,
    out_store,
    errors_csv,
    capture: dict,
    extract: dict,
    max_tokens: int,
    architecture: str | None = None,
    commit_every: int = 64,
    weights_cache=None,
    stop_after_commits: int | None = None,
    progress: bool = True,
    target=None,
):
    """eyrie.extract.shard.extract_shard for capture.backend: sglang (same arguments, same result)."""
    from eyrie.extract import shard as ex
    from eyrie.sglang.patch.bundle import PatchError, load_manifest
    from eyrie.target.load import load_tokenizer, num_hidden_layers, read_architecture, read_config

    start = time.perf_counter()
    seconds = dict.fromkeys(("setup", "capture", "write", "total"), 0.0)
    s = settings_of(capture)
    if not s["bundle"]:
        raise SglangError(
            "capture.sglang.bundle is not set: give the folder patch_server wrote "
            "(results/patch in the workflow; `eyrie patch-server` outside it)"
        )
    bundle = Path(s["bundle"])
    try:
        manifest = load_manifest(bundle)
    except PatchError as exc:
        raise SglangError(str(exc)) from None
    shards = int(extract["shards"])
    batch_size = int(capture.get("batch_size", 8))
    commit_every = max(batch_size, -(-int(commit_every) // batch_size) * batch_size)
    out_store, errors_csv = Path(out_store), Path(errors_csv)
    work_store, work_errors = ex.work_paths(out_store, errors_csv)

    members = ex.shard_members(ex.read_split(data_path), shard, shards)
    aux_ids = ex.resolve_aux_layer_ids(capture.get("aux_layer_ids"), num_hidden_layers(target_path))
    if aux_ids != manifest["aux_layer_ids"]:
        raise SglangError(
            f"the patch bundle {bundle} captures aux layers {manifest['aux_layer_ids']}, the "
            f"config asks for {aux_ids}; rerun verify_env and patch_server"
        )
    arch = read_architecture(target_path, architecture)
    if arch != manifest["architecture"]:
        raise SglangError(
            f"the patch bundle {bundle} was verified for {manifest['architecture']}, the target "
            f"is {arch}; rerun verify_env and patch_server"
        )
    tokenizer = target.tokenizer if target is not None else load_tokenizer(target_path)
    good, errors = ex._tokenize(tokenizer, members, max_tokens)
    sources = {r.line: r.source for r in members}
    settings = {
        "capture": {**capture, "aux_layer_ids": aux_ids},
        "extract": dict(extract),
        "max_tokens": int(max_tokens),
        "commit_every": commit_every,
        "architecture": arch,
        "sglang": {
            "version": manifest["sglang"]["version"],
            "mechanism": manifest["mechanism"],
            "manifest_sha256": proto.sha256_file(bundle / "manifest.json"),
        },
    }
    provenance = ex.provenance_for(
        target_path,
        backend="sglang",
        split=split,
        shard=shard,
        shards=shards,
        data_path=data_path,
        settings=settings,
        device=torch.device("cuda"),
        dtype=STATES_DTYPES.get(s["dtype"], torch.bfloat16),
        weights_cache=weights_cache,
    )
    if s["dtype"] == "auto":
        provenance["dtype"] = "auto"
    hidden = _hidden_size(read_config(target_path))
    # Locked before the scratch store is looked at; held until the store is in place.
    lock = StoreLock(work_store).acquire()
    writer = None
    try:
        writer = ex._open_writer(
            work_store,
            provenance,
            lock=lock,
            hidden_size=hidden,
            aux_layer_ids=aux_ids,
            chunk_tokens=int(extract.get("chunk_tokens", 256)),
            shard_tokens=int(extract.get("shard_tokens", 16384)),
            precision=str(extract.get("precision", "lossless")),
        )
        rid_prefix = f"{s['rid_prefix']}{split}.{shard:03d}:"
        log_dir = Path(s["log_dir"]) if s["log_dir"] else errors_csv.parent
        server_log = log_dir / f"{out_store.stem}.sglang.log"
        stats = None
        try:
            groups, bar = ex.resume_plan(
                writer,
                work_store,
                work_errors,
                good,
                errors,
                members,
                commit_every,
                desc=f"extract {split}/{shard:03d} (sglang)",
                progress=progress,
            )
            t0, tokens, commits = time.monotonic(), 0, 0
            seconds["setup"] = time.perf_counter() - start
            if groups:
                with patched_server(
                    bundle=bundle,
                    manifest=manifest,
                    target_path=target_path,
                    settings=s,
                    rid_prefix=rid_prefix,
                    log_path=server_log,
                ) as (url, folder):
                    seconds["setup"] = time.perf_counter() - start
                    stats = folder.stats
                    cap = SglangCapture(url, folder, s, rid_prefix)
                    try:
                        for group in groups:
                            tick = time.perf_counter()
                            results = cap.capture([(g.sample_id, g.input_ids) for g in group])
                            seconds["capture"] += time.perf_counter() - tick
                            tick = time.perf_counter()
                            for g, res in zip(group, results, strict=True):
                                if isinstance(res[0], str):  # ("error", reason, detail)
                                    errors[g.line] = (g.sample_id, res[1], res[2])
                                    continue
                                aux, final = res
                                if not (torch.isfinite(aux).all() and torch.isfinite(final).all()):
                                    why = "the target gave NaN or Inf"
                                    errors[g.line] = (g.sample_id, "non_finite", why)
                                    continue
                                errors.pop(g.line, None)
                                writer.append(g.sample_id, g.input_ids, g.loss_mask, aux, final)
                                tokens += len(g.input_ids)
                            writer.commit()
                            ex.write_errors(work_errors, errors, sources)
                            seconds["write"] += time.perf_counter() - tick
                            commits += 1
                            bar.update(len(group))
                            bar.set_postfix(
                                tok_s=f"{tokens / max(time.monotonic() - t0, 1e-9):.0f}"
                            )
                            if stop_after_commits is not None and commits >= stop_after_commits:
                                raise ex.Interrupted(f"stopped after {commits} commits (as asked)")
                    finally:
                        cap.close()
            bar.close()
            writer.finish()
            outcome = ex.Outcome(out_store, errors_csv, writer.num_samples, writer.num_tokens)
        finally:
            writer.close()
        ex.place_store(work_store, work_errors, out_store, errors_csv, errors, sources)
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        raise ExtractError(
            for_extract(work_store, out_store, writer, good, aux_ids, hidden)
        ) from exc
    finally:
        lock.release()
    ex.close_outcome(outcome, work_store, errors, good, max_tokens, seconds, start)
    if stats is not None:
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
    log.info(
        "%s: %d samples, %d tokens, %d errors %s",
        out_store,
        outcome.samples,
        outcome.tokens,
        len(errors),
        outcome.errors,
    )
    return outcome


def _hidden_size(config: dict) -> int:
    for cfg in (config, config.get("text_config") or {}):
        if isinstance(cfg.get("hidden_size"), int):
            return int(cfg["hidden_size"])
    raise SglangError("the target's config.json has no hidden_size")
