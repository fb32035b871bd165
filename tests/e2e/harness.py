"""The steps an end-to-end run of the SGLang backend is made of, shared by its variants.

Each step runs in its own process group where it starts processes (`run_cmd`, the same handling
as an SGLang server's), is timed, and fills the run's summary; a failing step raises StepError
with the log tail that explains it. `finish` writes the summary (JSON, markdown, log tails)
however the run ended.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

import yaml

from eyrie.sglang.http import post_json
from eyrie.sglang.launch import capture_command, launcher
from eyrie.sglang.patch.settings import sglang_settings
from eyrie.sglang.server import log_tail, ready_server

REPO = Path(__file__).resolve().parents[2]
# capture.sglang.launcher of a CPU rehearsal: the transformers-backed stand-in server
STANDIN = [sys.executable, str(Path(__file__).resolve().with_name("standin.py"))]


def why_no_gpu_run() -> str | None:
    """Why the GPU end-to-end tests skip here (no CUDA device, no sglang), or None to run."""
    import importlib.util

    import torch

    if not torch.cuda.is_available():
        return "no CUDA device"
    if importlib.util.find_spec("sglang") is None:
        return "sglang is not installed"
    return None


class StepError(RuntimeError):
    """A step failed; the message says which and carries the relevant log tail."""


def versions() -> dict:
    out = {"python": platform.python_version(), "machine": platform.node()}
    for name in ("torch", "transformers", "sglang", "snakemake", "zarr", "numcodecs", "eyrie"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    try:
        import torch

        out["cuda"] = torch.version.cuda
        out["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception as exc:  # report, do not fail, on a broken CUDA setup
        out["gpu"] = f"unavailable: {exc}"
    return out


def run_cmd(cmd: list[str], log: Path, timeout: float, env=None) -> None:
    """Run a command in its own process group, logged; its whole group is stopped however this
    ends (an error, the time budget, or SIGTERM to this process)."""
    import signal

    from eyrie.sglang.server import SglangServer

    log.parent.mkdir(parents=True, exist_ok=True)
    proc = SglangServer(cmd, log, 0, env=env)  # the same process-group handling as a server
    with proc:
        try:
            code = proc.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            why = f"{cmd[:4]} ran past {timeout:.0f} s; log {log}:\n{log_tail(log, 60)}"
            raise StepError(why) from None
        finally:
            if proc.proc.poll() is None:
                os.killpg(proc.proc.pid, signal.SIGTERM)  # snakemake cancels its jobs
    if code != 0:
        raise StepError(f"{cmd[:4]} exited {code}; log {log}:\n{log_tail(log, 60)}")


class Run:
    """One end-to-end run: its steps, their timings and the summary they fill.

    A subclass names the workflow config it starts from (`config_file`) and how its summary
    reads (`render`)."""

    config_file: Path
    render = staticmethod(lambda summary: json.dumps(summary, indent=1) + "\n")

    def __init__(self, out: Path, work: Path, standin: bool, budget_s: float, tp=None):
        self.out, self.work, self.standin, self.tp = out, work, standin, tp
        self.t0 = time.monotonic()
        self.budget = budget_s
        self.summary: dict = {
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "mode": "standin (CPU rehearsal)" if standin else "sglang",
            "versions": versions(),
            "steps": {},
            "ok": False,
        }
        self.logs: list[Path] = []

    def left(self) -> float:
        return max(30.0, self.budget - (time.monotonic() - self.t0))

    def step(self, name: str, fn, *args):
        print(f"== {name}", flush=True)
        t = time.monotonic()
        try:
            result = fn(*args)
        except Exception as exc:
            self.summary["steps"][name] = {"ok": False, "seconds": round(time.monotonic() - t, 1)}
            self.summary["error"] = f"{name}: {exc}"
            raise
        self.summary["steps"][name] = {"ok": True, "seconds": round(time.monotonic() - t, 1)}
        print(f"   {name}: {time.monotonic() - t:.1f} s", flush=True)
        return result

    # -- steps ----------------------------------------------------------------------------

    def build_target(self) -> Path:
        target = self.work / "toy-deepseek"
        cmd = [sys.executable, "-m", "eyrie.target.toy.deepseek", "--out", str(target)]
        cmd += ["--tokenizer", str(REPO / "models" / "toy-llama")]
        if self.standin:
            cmd.append("--tiny")
        run_cmd(cmd, self.work / "logs" / "toy.log", self.left())
        return target

    def write_config(self, target: Path) -> Path:
        cfg = yaml.safe_load(self.config_file.read_text())
        cfg["results"] = str(self.work / "results")
        cfg["target"]["path"] = str(target)
        sg = cfg["capture"]["sglang"]
        sg["log_dir"] = str(self.work / "logs")
        if self.tp:
            sg["tp"] = self.tp
            self.summary["tp"] = self.tp
        if self.standin:
            cfg["dataset"]["max_samples"] = {"train": 24, "heldout": 4}
            cfg["dataset"]["max_tokens"] = 96
            # samples are cut at 96 tokens anyway: longer answers only cost generation time
            cfg.setdefault("regenerate", {})["max_new_tokens"] = 48
            cfg["capture"]["device"] = "cpu"
            cfg["verify"]["sglang"] = "pip:0.5.12"
            sg.update(launcher=STANDIN, chunked_prefill_size=32, launch_timeout_s=120)
            cfg["validate"]["spot_check_samples"] = 2
        path = self.work / "config.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        self.config = cfg
        return path

    def env(self) -> dict:
        env = dict(os.environ)
        paths = [str(REPO)]
        if self.standin:  # the verified release must be findable for the pre-launch hash check
            from eyrie.verify.source import locate

            paths.append(str(locate("pip:0.5.12").root))
        env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")]).rstrip(":")
        return env

    def workflow(self, config: Path) -> dict:
        results = Path(self.config["results"])
        want = results / "validate" / "train" / "shard-000.json"
        cmd = [sys.executable, "-m", "snakemake", "--cores", "4", "--configfile", str(config)]
        cmd += ["--directory", str(REPO), "--nolock", "--rerun-incomplete", str(want)]
        log = self.work / "logs" / "snakemake.log"
        self.logs += [log, self.work / "logs" / "shard-000.sglang.log"]
        self.logs += [results / "logs" / "extract" / "train" / "shard-000.log"]
        self.logs += [results / "logs" / "validate" / "train" / "shard-000.log"]
        try:
            run_cmd(cmd, log, self.left(), env=self.env())
        except StepError as exc:
            jobs = "\n".join(f"--- {p}\n{log_tail(p, 40)}" for p in self.logs[1:] if p.exists())
            raise StepError(f"{exc}\n{jobs}") from None
        report = json.loads(want.read_text())
        shutil.copyfile(want, self.out / "validate.json")
        shutil.copyfile(results / "patch" / "manifest.json", self.out / "manifest.json")
        manifest = json.loads((results / "patch" / "manifest.json").read_text())
        store = results / "store" / "train" / "shard-000.zarr"
        chunk = self.config["capture"]["sglang"]["chunked_prefill_size"]
        lengths = _lengths(store)
        extract_log = log_tail(results / "logs" / "extract" / "train" / "shard-000.log", 400)
        self.summary["workflow"] = {
            "samples": len(lengths),
            "tokens": int(sum(lengths)),
            "chunked_prefill_size": chunk,
            "samples_longer_than_chunk": int(sum(n > chunk for n in lengths)),
            "longest": int(max(lengths)) if lengths else 0,
            "client_log": [ln for ln in extract_log.splitlines() if "sglang:" in ln][-1:],
            "mechanism": manifest["mechanism"],
            "mechanism_why": manifest["mechanism_why"],
            "sglang_verified": manifest["sglang"]["version"],
            "validate_errors": report.get("errors"),
            "validate_cosine": report.get("cosine"),
            "validate_greedy_match": report.get("greedy_match"),
        }
        if report.get("errors") != 0:
            raise StepError(
                f"validate found {report.get('errors')} errors: "
                f"{json.dumps(report.get('error_counts'))}; first rows: "
                f"{json.dumps(report.get('problems', [])[:5])}"
            )
        if not self.standin and self.summary["workflow"]["samples_longer_than_chunk"] == 0:
            raise StepError(f"no sample is longer than the prefill chunk ({chunk} tokens)")
        return manifest

    def hf_extract(self) -> Path:
        """The transformers backend on the very conversations the workflow's store was made
        of (the regenerated split when regenerate.enabled), read from its provenance."""
        from eyrie.extract.shard import extract_shard

        results = Path(self.config["results"])
        data = extracted_input(results / "store" / "train" / "shard-000.zarr")
        out = self.work / "hf"
        capture = {**self.config["capture"], "backend": "hf"}
        capture["device"] = "cpu" if self.standin else "cuda"
        outcome = extract_shard(
            data_path=data,
            target_path=self.config["target"]["path"],
            split="train",
            shard=0,
            out_store=out / "shard-000.zarr",
            errors_csv=out / "shard-000.errors.csv",
            capture=capture,
            extract={**self.config["extract"]},
            max_tokens=self.config["dataset"]["max_tokens"],
            progress=False,
        )
        self.summary["hf"] = {
            "samples": outcome.samples,
            "seconds": outcome.seconds,
            "data_path": str(data),
        }
        return out / "shard-000.zarr"

    def compare(self, hf_store: Path) -> dict:
        from eyrie.store.compare import compare, render

        results = Path(self.config["results"])
        report = compare([results / "store" / "train" / "shard-000.zarr"], [hf_store])
        (self.out / "compare.json").write_text(json.dumps(report, indent=1) + "\n")
        print(render(report), flush=True)
        self.summary["compare"] = {
            "hf_device": "cpu float32" if self.standin else "cuda bf16",
            **{k: v for k, v in report.items() if k not in ("stores_a", "stores_b")},
        }
        if not report["ok"]:
            raise StepError(f"the SGLang and transformers stores differ:\n{render(report)}")
        return report

    def throughput(self, manifest: dict) -> dict:
        results = Path(self.config["results"])
        samples = _samples(results / "store" / "train" / "shard-000.zarr")
        plain = bench(self, manifest, samples, patched=False)
        patched = bench(self, manifest, samples, patched=True)
        out = {
            "requests": len(samples),
            "tokens": int(sum(len(ids) for _, ids in samples)),
            "concurrency": self.config["capture"]["sglang"]["concurrency"],
            "plain_tokens_per_s": plain["tokens_per_s"],
            "patched_tokens_per_s": patched["tokens_per_s"],
            "ratio": patched["tokens_per_s"] / plain["tokens_per_s"],
            "plain": plain,
            "patched": patched,
        }
        self.summary["throughput"] = out
        return out

    def import_hook(self, n: int = 32) -> dict:
        """The import hook on the same release: SGLang's own aux capture, switched on by the
        finder, must give the states the forward hooks gave (same samples, same server flags)."""
        from eyrie.sglang.patch.bundle import build_bundle
        from eyrie.store.compare import token_cosine

        results = Path(self.config["results"])
        bundle = self.work / "patch-import-hook"
        manifest = build_bundle(results / "verify" / "report.json", bundle, mechanism="import_hook")
        samples = _samples(results / "store" / "train" / "shard-000.zarr", full=True)[:n]
        with served(self, "import-hook", bundle, manifest) as send:
            got = send([(sid, x["input_ids"].numpy()) for sid, x in samples], "")
        names = [f"aux {i}" for i in manifest["aux_layer_ids"]] + ["final"]
        cos = {name: [] for name in names}
        for (_, ref), (aux, final) in zip(samples, got, strict=True):
            for j, name in enumerate(names[:-1]):
                cos[name].append(token_cosine(aux[:, j], ref["aux_hidden"][:, j]))
            cos["final"].append(token_cosine(final, ref["final_hidden"]))
        layers = {k: float(torch_cat(v).mean()) for k, v in cos.items()}
        out = {"samples": len(samples), "mean_cosine_vs_forward_hooks": layers}
        out["why"] = manifest["mechanism_why"]
        self.summary["import_hook"] = out
        if min(layers.values()) < 0.999:
            raise StepError(f"the import hook's states differ from the forward hooks': {layers}")
        return out

    # -- output ---------------------------------------------------------------------------

    def write(self) -> None:
        self.summary["seconds"] = round(time.monotonic() - self.t0, 1)
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=1) + "\n")
        (self.out / "summary.md").write_text(self.render(self.summary))
        with open(self.out / "logs.txt", "w") as f:
            for p in dict.fromkeys(self.logs):
                f.write(f"===== {p}\n{log_tail(p, 120)}\n")


def extracted_input(store: Path) -> Path:
    """The conversations file a store was extracted from, as its provenance records it, after
    checking that the file still holds what was extracted (its sha256)."""
    from eyrie.common.provenance import file_sha256
    from eyrie.store.shard import ShardReader

    prov = ShardReader(store).attrs.get("provenance") or {}
    if not prov.get("data_path") or not prov.get("data_sha256"):
        raise StepError(f"{store}: its provenance records no data_path and data_sha256")
    path = Path(prov["data_path"])
    if not path.is_absolute():  # relative to the workflow's directory (--directory REPO)
        path = REPO / path
    if not path.is_file():
        raise StepError(f"{store} was extracted from {path}, which no longer exists")
    if (digest := file_sha256(path)) != prov["data_sha256"]:
        raise StepError(
            f"{path} changed since {store} was extracted from it (sha256 {digest}, the store's "
            f"provenance says {prov['data_sha256']}); run the workflow again so both sides "
            "read the same conversations"
        )
    return path


def _lengths(store: Path) -> list[int]:
    from eyrie.store.shard import ShardReader

    offsets = ShardReader(store).offsets
    return [int(b - a) for a, b in zip(offsets[:-1], offsets[1:], strict=True)]


def _samples(store: Path, full: bool = False) -> list:
    """(sample id, token ids) of a store's samples; with full, (sample id, the whole sample)."""
    from eyrie.store.shard import ShardReader

    r = ShardReader(store)
    if full:
        return [(r.sample_ids[i], r[i]) for i in range(len(r))]
    return [(r.sample_ids[i], r[i]["input_ids"].numpy()) for i in range(len(r))]


def torch_cat(parts):
    import torch

    return torch.cat(parts)


@contextmanager
def served(run: Run, name: str, bundle: Path | None, manifest: dict):
    """A server of the target, patched with `bundle` or not; yields send(samples, tag).

    Patched: send captures the samples (dumps read back and checked) and returns their
    (aux, final). Unpatched: the same requests, answers only.
    """
    from eyrie.extract.sglang import SglangCapture, patched_server

    cfg = run.config
    s = sglang_settings(cfg["capture"])
    prefix = f"{s['rid_prefix']}{name}:"
    log = run.work / "logs" / f"{name}.log"
    run.logs.append(log)
    timeout = min(float(s["launch_timeout_s"]), run.left())
    if bundle is not None:
        settings = {**s, "url": None, "dump_dir": None, "launch_timeout_s": timeout}
        with patched_server(
            bundle=bundle,
            manifest=manifest,
            target_path=cfg["target"]["path"],
            settings=settings,
            rid_prefix=prefix,
            log_path=log,
            base_env=run.env(),
        ) as (url, folder):
            cap = SglangCapture(url, folder, s, prefix)

            def send(batch, tag):
                return cap.capture([(f"{tag}{sid}", ids) for sid, ids in batch])

            send.ready_s = round(folder.server.ready_s, 1)
            try:
                yield send
            finally:
                cap.close()
        return

    def command(port: int) -> list[str]:  # the same eager, cache-free server, unpatched
        return capture_command(
            cfg["target"]["path"],
            port,
            launcher=s["launcher"] or launcher(s["python"]),
            tp=s["tp"],
            chunked_prefill_size=s["chunked_prefill_size"],
            dtype=s["dtype"],
            server_args=s["server_args"],
            patch_args=list(manifest["server_flags"]),
        )

    command(0)  # refuses bad configured flags before anything starts
    pool = ThreadPoolExecutor(int(s["concurrency"]))
    try:
        with ready_server(command, log, timeout, env=run.env()) as server:

            def one(item):
                rid, ids = item
                payload = {
                    "input_ids": [int(i) for i in ids],
                    "rid": rid,
                    "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
                }
                code, body = post_json(f"{server.url}/generate", payload, 300)
                if code != 200:
                    raise StepError(f"the unpatched server answered {code}: {body}")

            def send(batch, tag):
                return list(pool.map(one, [(f"{prefix}{tag}{sid}", ids) for sid, ids in batch]))

            send.ready_s = round(server.ready_s, 1)
            yield send
    finally:
        pool.shutdown(cancel_futures=True)


def bench(run: Run, manifest: dict, samples: list, *, patched: bool) -> dict:
    """Tokens/s of the same requests on one server, patched or not (warm-up excluded)."""
    bundle = Path(run.config["results"]) / "patch" if patched else None
    with served(run, "patched" if patched else "plain", bundle, manifest) as send:
        send(samples[:8], "warm-")
        t0 = time.perf_counter()
        for i in range(0, len(samples), 64):  # bounded memory: results are dropped per group
            send(samples[i : i + 64], "run-")
        seconds = time.perf_counter() - t0
    tokens = sum(len(ids) for _, ids in samples)
    return {"ready_s": send.ready_s, "seconds": seconds, "tokens_per_s": tokens / seconds}


def finish(run: Run, steps, title: str) -> int:
    """Run `steps()`, then write the summary however they ended; the exit code of the run."""
    print(f"{title}, {run.summary['date']}", flush=True)
    print(json.dumps(run.summary["versions"]), flush=True)
    try:
        steps()
        run.summary["ok"] = True
    except Exception as exc:
        run.summary.setdefault("error", f"{type(exc).__name__}: {exc}")
        if not isinstance(exc, StepError):
            run.summary["error"] += "\n" + traceback.format_exc()
        print(f"FAILED: {run.summary['error']}", file=sys.stderr, flush=True)
    finally:
        run.write()
    print(run.render(run.summary), flush=True)
    print(f"results in {run.out}", flush=True)
    return 0 if run.summary["ok"] else 1
