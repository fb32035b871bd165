"""The regenerate stage for one split: resumable, counted, with provenance.

Conversations are regenerated in chunks of `chunk` conversations. Each finished chunk is
appended to a work file (`.work/<split>.jsonl` beside the output, one outcome per line, then an
end-of-chunk line) and fsynced, so a killed run loses at most the chunk in progress: the next
run keeps every complete chunk, drops a torn tail, and goes on from there. Each chunk is seeded
from (seed, chunk number), so a resumed run samples what an uninterrupted one would have. Only
when every chunk is done are the output JSONL and its summary written (atomically), and the
work file removed. A second job on the same split is refused (the work file is locked).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from eyrie.common import atomic
from eyrie.common.errors import EyrieError
from eyrie.common.progress import bar
from eyrie.common.provenance import file_sha256, package_versions
from eyrie.regenerate.settings import RegenerateSettings, regenerate_settings
from eyrie.regenerate.turns import (
    GENERATED,
    Outcome,
    assistant_turns,
    count,
    regenerate_conversations,
)

log = logging.getLogger(__name__)
WORK_DIR = ".work"
BACKENDS = ("hf", "sglang")


class RegenerateError(EyrieError, RuntimeError):
    """The stage cannot run as configured; the message names the setting or file to fix."""


def read_records(path: Path) -> list[dict]:
    """The prepared split (rule prepare_dataset's JSONL: id, messages, source per line)."""
    try:
        with open(path, encoding="utf-8") as f:  # not splitlines(): U+2028 sits inside strings
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, json.JSONDecodeError) as exc:
        raise RegenerateError(f"cannot read the prepared split {path}: {exc}") from None


def read_work(path: Path) -> list[Outcome]:
    """The outcomes of every complete chunk in a work file; a torn tail is cut off the file."""
    if not path.exists():
        return []
    done: list[Outcome] = []
    chunk: list[Outcome] = []
    good_bytes = 0
    with open(path, "rb") as fh:
        for raw in fh:
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError:
                break  # a line cut by a kill: it and what follows are redone
            if "chunk_end" in obj:
                done += chunk
                chunk = []
                good_bytes = fh.tell()
            else:
                chunk.append(Outcome.from_json(obj))
    if good_bytes < path.stat().st_size:
        with open(path, "r+b") as fh:
            fh.truncate(good_bytes)
    return done


def append_chunk(fh, outcomes: list[Outcome], number: int) -> None:
    lines = [json.dumps(o.to_json()) for o in outcomes] + [json.dumps({"chunk_end": number})]
    fh.write(("\n".join(lines) + "\n").encode())
    fh.flush()
    os.fsync(fh.fileno())


@dataclass(frozen=True)
class SplitJob:
    """One split to regenerate: where it comes from, where it goes, which target answers."""

    data: Path  # the prepared split (rule prepare_dataset)
    target: Path  # the target's HF folder
    out: Path  # the regenerated JSONL; its summary goes beside it (SPLIT.summary.json)
    split: str = ""
    architecture: str | None = None
    sample_tokens: int | None = None  # dataset.max_tokens: no answers asked past it

    @property
    def summary(self) -> Path:
        return Path(self.out).with_name(
            Path(self.out).name.removesuffix(".jsonl") + ".summary.json"
        )


def regenerate_split(job: SplitJob, settings: dict, *, progress=True, generator_factory=None):
    """Regenerate one prepared split; returns the summary written beside the output.

    ``settings`` is the regenerate section as given (the summary records it); the run reads it
    typed once (eyrie/regenerate/settings.py). `generator_factory(model_path, typed settings,
    architecture) -> (generator, tokenizer, max_positions)` builds the backend (default:
    transformers in-process); tests pass a stand-in.
    """
    data_path, out_jsonl, summary_json = Path(job.data), Path(job.out), job.summary
    target_path, architecture, split = job.target, job.architecture, job.split
    typed = regenerate_settings(settings)
    if typed.backend not in BACKENDS:
        raise RegenerateError(
            f"regenerate.backend {typed.backend!r} is not one of {list(BACKENDS)}"
        )
    records = read_records(data_path)
    work = out_jsonl.parent / WORK_DIR / out_jsonl.name
    work.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(work, "ab") as fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RegenerateError(
                f"{work} is locked by another regenerate job of this split; wait for it to end"
            ) from None
        done = read_work(work)
        fh.seek(0, os.SEEK_END)
        if done:
            log.info("resuming %s: %d of %d conversations done", work, len(done), len(records))
        if len(done) < len(records):
            factory = generator_factory or _factory(typed, out_jsonl, split)
            generator, tokenizer, max_positions = factory(target_path, typed, architecture)
            try:
                done = _run_chunks(
                    fh, records, done, (generator, tokenizer, max_positions), typed, split,
                    progress, job.sample_tokens,
                )  # fmt: skip
            finally:
                close = getattr(generator, "close", None)
                if close is not None:  # a server backend stops its server
                    close()
    counts = count(done)
    if counts["input"] != len(records) or [o.index for o in done] != list(range(len(records))):
        raise RegenerateError(
            f"{work} does not hold exactly the {len(records)} conversations of {data_path} in "
            "order (it was written for other data); delete it and rerun"
        )
    if records and not counts[GENERATED]:
        work.unlink()  # nothing worth resuming: a rerun with the fix starts afresh
        raise RegenerateError(nothing_generated(data_path, split, counts))
    summary = {
        "split": split,
        "input": str(data_path),
        "input_sha256": file_sha256(data_path),
        "target": str(target_path),
        "settings": dict(settings),
        "counts": counts,
        "seconds": round(time.perf_counter() - start, 2),
        "versions": package_versions(),
    }
    lines = [json.dumps(o.record) for o in done if o.status == GENERATED]
    atomic.write_text(out_jsonl, "".join(line + "\n" for line in lines))
    atomic.write_json(summary_json, summary)
    work.unlink()
    try:
        work.parent.rmdir()
    except OSError:  # another split's work file is still there
        pass
    return summary


# What to change when every conversation ended the same way (turns.py's kinds).
FIXES = {
    "prompt_too_long": "the prompts leave no room for regenerate.max_new_tokens in the target's "
    "positions: lower regenerate.max_new_tokens",
    "empty_answer": "the target answered with nothing: check that its chat template ends the "
    "prompt where an answer starts, and that it is an instruction-tuned model",
    "request_failed": "every request to the SGLang server failed: its log (beside the output) "
    "says why",
    "no_assistant_turn": "no conversation has a user or assistant turn for the target to answer",
}


def nothing_generated(data_path, split: str, counts: dict) -> str:
    """The message for a split none of whose conversations was regenerated."""
    kinds = {k: n for k, n in counts["kinds"].items() if k in FIXES}
    why = ", ".join(f"{k}: {n}" for k, n in kinds.items()) or "no answers"
    fixes = "; ".join(FIXES[k] for k in kinds)
    return (
        f"regenerate {split}: none of the {counts['input']} conversations of {data_path} was "
        f"regenerated ({why}), so extraction would have nothing to store"
        + (f". {fixes[0].upper()}{fixes[1:]}" if fixes else "")
        + ". Or set regenerate.enabled: false to extract the dataset's own answers"
    )


class TurnMeter:
    """The stage's progress: assistant turns settled of the split's (with an ETA), and the new
    tokens so far with their rate, which move between turns while a batch decodes."""

    def __init__(self, records: list[dict], done: int, split: str, progress: bool):
        self.bar = bar(
            total=assistant_turns(records), initial=done, desc=f"regenerate {split}",
            unit="turn", disable=not progress,
        )  # fmt: skip
        self.tokens, self.start = 0, time.perf_counter()
        self._lock = threading.Lock()  # the sglang backend reports from its request threads

    def add_tokens(self, n: int) -> None:
        with self._lock:
            self.tokens += n
            rate = self.tokens / max(time.perf_counter() - self.start, 1e-9)
            self.bar.set_postfix_str(f"{self.tokens} new tokens, {rate:.0f} tokens/s", False)
            self.bar.update(0)  # shown when the bar's interval has passed

    def add_turns(self, n: int) -> None:
        with self._lock:
            self.bar.update(n)

    def close(self) -> None:
        self.bar.close()


def _run_chunks(
    fh,
    records,
    done,
    backend,
    settings: RegenerateSettings,
    split: str,
    progress,
    sample_tokens=None,
) -> list:
    """Regenerate the chunks after `done`, appending each to the work file; all outcomes."""
    generator, tokenizer, max_positions = backend
    max_prompt = max_positions - settings.max_new_tokens
    if max_prompt < 1:
        raise RegenerateError(
            f"regenerate.max_new_tokens ({settings.max_new_tokens}) leaves no room for "
            f"a prompt in the target's {max_positions} positions; lower it"
        )
    size = settings.chunk
    meter = TurnMeter(records, assistant_turns(records[: len(done)]), split, progress)
    generator.on_tokens = meter.add_tokens  # generators without the hook just ignore it
    try:
        for first in range(len(done), len(records), size):
            number = first // size
            _seed(settings.seed, number)
            outcomes = regenerate_conversations(
                records[first : first + size], first, generator, tokenizer, max_prompt,
                on_turns=meter.add_turns, sample_tokens=sample_tokens,
            )  # fmt: skip
            append_chunk(fh, outcomes, number)
            done = done + outcomes
    finally:
        meter.close()
    return done


def _factory(settings: RegenerateSettings, out_jsonl: Path, split: str):
    """The backend's generator factory; sglang's server log goes beside the output."""
    if settings.backend == "sglang":
        from functools import partial

        from eyrie.regenerate.sglang import sglang_generator

        return partial(sglang_generator, log_path=out_jsonl.parent / f"{split}.sglang.log")
    return hf_generator


def _seed(seed: int, chunk: int) -> None:
    import torch

    torch.manual_seed(seed * 1_000_003 + chunk)


def hf_generator(target_path, settings: RegenerateSettings, architecture: str | None = None):
    """transformers in-process: (HFGenerator, tokenizer, the target's position limit)."""
    from eyrie.common.device import pick_device
    from eyrie.regenerate.hf import HFGenerator
    from eyrie.target.load import load_model, load_tokenizer

    device = pick_device(settings.device, "regenerate.device")
    model, _ = load_model(target_path, device, architecture)
    tokenizer = load_tokenizer(target_path)
    cfg = (
        model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    )
    positions = int(getattr(cfg, "max_position_embeddings", 0) or 1 << 20)
    gen = HFGenerator(
        model,
        tokenizer,
        max_new_tokens=settings.max_new_tokens,
        temperature=settings.temperature,
        batch_size=settings.batch_size,
    )
    return gen, tokenizer, positions
