"""Snakemake adapter for rule validate_shard: eyrie.validate.shard.validate_shard, as JSON."""

from eyrie.common.adapter import rule_log
from eyrie.common.atomic import write_json
from eyrie.validate.shard import validate_shard

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

v = sm.params.validate
with rule_log(sm):
    report = validate_shard(
        store=sm.input.store,
        errors_csv=sm.input.errors,
        data_path=sm.input.data,
        target_path=sm.params.target,
        architecture=sm.params.architecture,
        split=sm.wildcards.split,
        shard=int(sm.wildcards.shard),
        shards=sm.params.shards,
        max_tokens=sm.params.max_tokens,
        aux_layer_ids=sm.params.capture["aux_layer_ids"],
        device=sm.params.capture["device"],
        spot_check_samples=v["spot_check_samples"],
        min_cosine=v["min_cosine"],
        min_greedy_match=v["min_greedy_match"],
        progress=True,  # a line in the job's log every few seconds
    )
    write_json(sm.output.report, report, default=str)
    print(f"{report['errors']} errors: {report['error_counts']}")
