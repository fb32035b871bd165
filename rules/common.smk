# Shared helpers for every stage: paths, splits and the target folder.

from eyrie.common.rerun import RERUN_ENV, Rerun

R = config["results"]
SPLITS = ["train", "heldout"]
SHARDS = [f"{i:03d}" for i in range(config["extract"]["shards"])]
TOY_DEEPSEEK = "toy-deepseek"
TOY_KIMI = "toy-kimi-k25"
TOYS = (TOY_DEEPSEEK, TOY_KIMI)


wildcard_constraints:
    split="|".join(SPLITS),
    shard=r"\d{3}",


def target_dir():
    """The target's HF folder: the configured one, or a toy the workflow builds."""
    if config["target"]["path"] in TOYS:
        return f"{R}/targets/{config['target']['path']}"
    return config["target"]["path"]


def check_target_folder():
    """Stop at parse time when target.path names no model folder (else Snakemake would report a
    MissingInputException for its config.json)."""
    path = config["target"]["path"]
    if path in TOYS or os.path.isfile(os.path.join(path, "config.json")):
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
        f"tokenizer), or to one of the toys the workflow builds: {', '.join(TOYS)}.",
        file=sys.stderr,
    )
    raise SystemExit(1)


check_target_folder()


# What the target is, by content (eyrie/target/identity.py): every rule that reads the target
# takes it as input, so changed weights, tokenizer or config rerun what depends on them. For a
# folder given in target.path it is brought up to date here, while the workflow is parsed, and
# rewritten only when a file's content changed: a new mtime alone (a touch) reruns nothing, and
# files whose size and mtime are unchanged are not hashed again (SHA256_CACHE, shared with the
# stores' weights digest). A toy's identity is rule target_identity's, after the toy is built.
TARGET_IDENTITY = f"{R}/target/identity.json"
SHA256_CACHE = f"{R}/target/.sha256-cache.json"


def record_target_identity():
    if config["target"]["path"] in TOYS:
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


def dataset_source(wildcards):
    return config["dataset"][wildcards.split]


def error_tables(split):
    """The errors tables of a split's shards. Rules that read stores list them as inputs too:
    Snakemake deletes a table before its store (rules/extract.smk), so a store half deleted by
    a killed run has no table, and the first job that needs the store extracts it again."""
    return expand(f"{R}/store/{split}/shard-{{shard}}.errors.csv", shard=SHARDS)


def final_outputs():
    outputs = [f"{R}/verify/report.json", f"{R}/validate/summary.csv"]
    outputs += [f"{R}/train/metrics.csv", f"{R}/train/heldout.json"]
    outputs += expand(f"{R}/export/{{engine}}", engine=config["export"]["engines"])
    outputs += expand(f"{R}/export/{{engine}}.check.json", engine=config["export"]["engines"])
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
