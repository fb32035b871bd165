# Shared helpers for every stage: paths, splits and the target folder.

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


def target_config():
    """config.json of the target: a file the workflow tracks, so a changed target reruns."""
    return f"{target_dir()}/config.json"


def dataset_source(wildcards):
    return config["dataset"][wildcards.split]


def final_outputs():
    outputs = [f"{R}/verify/report.json", f"{R}/validate/summary.csv"]
    outputs += [f"{R}/train/metrics.csv", f"{R}/train/heldout.json"]
    outputs += expand(f"{R}/export/{{engine}}", engine=config["export"]["engines"])
    outputs += expand(f"{R}/export/{{engine}}.check.json", engine=config["export"]["engines"])
    outputs += [f"{R}/report/summary.md"]
    return outputs
