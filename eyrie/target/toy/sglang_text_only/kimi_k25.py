"""The text-only processor SGLang uses for toy-kimi-k25 (see the package docstring)."""

from sglang.srt.models.kimi_k25 import KimiK25ForConditionalGeneration
from sglang.srt.multimodal.processors.base_processor import BaseMultimodalProcessor


class TextOnlyKimiK25Processor(BaseMultimodalProcessor):
    """Accepts the model; refuses any image or video, since the toy has no media processor."""

    models = [KimiK25ForConditionalGeneration]

    async def process_mm_data_async(self, *args, **kwargs):
        raise ValueError(
            "toy-kimi-k25 is served text-only (eyrie.target.toy.sglang_text_only): it has no media "
            "processor; send token ids or text without images"
        )
