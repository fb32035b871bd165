"""Static checks that the capture backend can deliver aux hidden states for the target.

For SGLang the check reads the release's source (never importing it) and follows
``set_eagle3_layers_to_capture`` from the top-level model class to the forward that captures;
for transformers it builds the target's module tree on the meta device.
"""

from eyrie.verify.source import SglangSource, VerifyError, locate
from eyrie.verify.stage import check_sglang, run_stage, write_report

__all__ = ["SglangSource", "VerifyError", "check_sglang", "locate", "run_stage", "write_report"]
