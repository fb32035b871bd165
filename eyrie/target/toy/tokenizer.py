"""A byte-level BPE tokenizer with a chat template, trained on the shipped chat dataset.

Role markers are single special tokens, so the template is prefix-stable: rendering the first
i messages gives a prefix of rendering i + 1, which is what loss masking relies on.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

BOS, END, PAD = "<|bos|>", "<|end|>", "<|pad|>"
ROLES = ("system", "user", "assistant")
SPECIAL_TOKENS = [PAD, BOS, END, *[f"<|{r}|>" for r in ROLES]]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def read_messages(path: str | Path) -> Iterator[list[dict]]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)["messages"]


def render(messages: list[dict]) -> str:
    """The chat template in plain Python, for training text (the Jinja copy is what users get)."""
    body = "".join(f"<|{m['role']}|>\n{m['content']}{END}\n" for m in messages)
    return BOS + body


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def special_token_ids(tokenizer) -> dict[str, int]:
    """The pad, bos and eos ids a toy's config takes from its tokenizer (in the order
    toy-kimi-k25's config.json lists them)."""
    return {
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }


def save_hf_tokenizer(tok: Tokenizer, out_dir: str | Path, model_max_length: int = 1024) -> None:
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=END,
        pad_token=PAD,
        model_max_length=model_max_length,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )
    hf.save_pretrained(str(out_dir))
