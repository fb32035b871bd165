"""Snakemake adapter for rule extract: eyrie.extract.shard.extract_shard on the rule's files."""

import contextlib
import logging

import torch

from eyrie.data.chat_tokens import SampleError
from eyrie.extract.shard import ExtractError, extract_shard
from eyrie.store.shard import StoreError
from eyrie.target.load import TargetError

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

torch.set_num_threads(sm.threads)
error = None
with open(sm.log[0], "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
    logging.basicConfig(stream=log, level=logging.INFO, format="%(levelname)s %(message)s")
    try:
        extract_shard(
            data_path=sm.input.data,
            target_path=sm.params.target,
            architecture=sm.params.architecture,
            split=sm.wildcards.split,
            shard=int(sm.wildcards.shard),
            out_store=sm.output.store,
            errors_csv=sm.output.errors,
            capture=dict(sm.params.capture),
            extract=dict(sm.params.extract),
            max_tokens=sm.params.max_tokens,
            weights_cache=sm.params.weights_cache,
        )
    except (ExtractError, TargetError, StoreError, SampleError) as exc:
        error = exc
        print(f"error: {exc}")
if error is not None:
    raise SystemExit(f"error: {error}")
