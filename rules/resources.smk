# Cluster requests (GPUs, CPUs, memory, runtime, partition, account, extra sbatch flags) for
# every rule, from config["resources"] (eyrie/common/resources.py, docs/cluster.md) over what the
# rule declares itself (a GPU job declares gpu=N). Included last in the Snakefile, so rules added
# later get their requests without declaring any.

from eyrie.common.resources import apply_to_rules

apply_to_rules(workflow, config)
