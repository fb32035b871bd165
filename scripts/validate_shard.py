"""Snakemake adapter for rule validate_shard: eyrie.validate.shard.validate_shard, as JSON."""

from eyrie.common.adapter import rule_log
from eyrie.common.atomic import write_json
from eyrie.validate.settings import validate_settings
from eyrie.validate.shard import validate_shard

sm = snakemake  # noqa: F821 - injected by Snakemake's script directive

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
        settings=validate_settings(sm.params.validate),
        progress=True,  # a line in the job's log every few seconds
    )
    write_json(sm.output.report, report, default=str)
    print(f"{report['errors']} errors: {report['error_counts']}")
