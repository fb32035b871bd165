"""Token ids and the assistant loss mask of one conversation, for any chat template.

Real templates carry no generation markers, so the assistant spans are found by rendering: for
each assistant message i, render(messages[:i], add_generation_prompt=True) must be a prefix of
render(messages[:i+1]), which must be a prefix of the whole conversation. The characters between
the two renderings are what the model produces for that turn: its content and the end-of-turn
marker the template writes after it. The marker is kept in the mask, since the drafter must learn
to stop; whitespace the template writes after the marker (a newline between turns) is not, as the
model never generates it. A template that breaks the prefix property (one that rewrites earlier
turns, say) is refused rather than guessed at.

The text is tokenized as `apply_chat_template(tokenize=True)` does it (no extra special tokens),
with character offsets; a token is in the mask when it overlaps an assistant span.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eyrie.common.errors import EyrieError


class SampleError(EyrieError, ValueError):
    """A sample that cannot be extracted; `reason` is a short kind for the errors table."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class TemplateError(SampleError):
    """The chat template cannot give assistant spans for this conversation."""


@dataclass
class Tokenized:
    input_ids: np.ndarray  # int32 (T,)
    loss_mask: np.ndarray  # uint8 (T,)
    full_length: int  # tokens before truncation


def render(tokenizer, messages: list[dict], add_generation_prompt: bool = False) -> str:
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )
    except Exception as exc:  # jinja raises many kinds (TemplateError, TypeError, ...)
        raise TemplateError("template_error", f"the chat template failed: {exc}") from None


def assistant_spans(tokenizer, messages: list[dict]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the [start, end) character span of each assistant turn."""
    full = render(tokenizer, messages)
    spans = []
    for i, msg in enumerate(messages):
        if msg.get("role") != "assistant":
            continue
        if i == 0:
            raise TemplateError(
                "assistant_first",
                "the conversation opens with an assistant message; its prompt cannot be rendered",
            )
        prompt = render(tokenizer, messages[:i], add_generation_prompt=True)
        upto = render(tokenizer, messages[: i + 1])
        if not upto.startswith(prompt) or not full.startswith(upto):
            raise TemplateError(
                "not_prefix_stable",
                f"the chat template is not prefix-stable at message {i}: rendering the turns "
                "before an assistant message (with the generation prompt) is not a prefix of "
                "the rendered conversation, so assistant tokens cannot be located",
            )
        start, end = len(prompt), len(upto)
        while end > start and upto[end - 1].isspace():
            end -= 1
        if end > start:
            spans.append((start, end))
    return full, spans


def tokenize_chat(tokenizer, messages: list[dict], max_tokens: int) -> Tokenized:
    """input_ids and loss_mask cut to max_tokens; SampleError when no assistant token is left."""
    text, spans = assistant_spans(tokenizer, messages)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = np.asarray(enc["input_ids"], dtype=np.int32)
    offsets = np.asarray(enc["offset_mapping"], dtype=np.int64).reshape(-1, 2)
    mask = np.zeros(len(ids), dtype=np.uint8)
    nonempty = offsets[:, 1] > offsets[:, 0]
    for start, end in spans:
        mask[nonempty & (offsets[:, 0] < end) & (offsets[:, 1] > start)] = 1
    if len(ids) == 0:
        raise SampleError("empty", "the rendered conversation has no tokens")
    if not mask.any():
        raise SampleError("empty_mask", "no assistant token (no assistant turn with content)")
    full_length = len(ids)
    prompt = int(mask.argmax())  # tokens before the first assistant token
    if prompt >= max_tokens:
        raise SampleError(
            "too_long",
            f"the prompt before the first assistant answer is {prompt} tokens (chat template "
            f"included, {full_length} in all), so no answer token is within dataset.max_tokens "
            f"({max_tokens})",
        )
    ids, mask = ids[:max_tokens], mask[:max_tokens]
    return Tokenized(ids, mask, full_length)


def answer_slots(messages: list[dict]) -> list[dict]:
    """The conversation with every answer the target gives when it regenerates it: each
    assistant turn (replaced by the target's answer), and a new assistant turn (content None)
    after each user turn that no assistant turn answers, because another user turn or the end
    comes first (system turns between do not count). So every user turn is answered: MT-bench's
    two questions, [user, user], become [user, None, user, None]."""
    out: list[dict] = []
    answered = False  # an assistant turn comes before the next user turn
    for msg in reversed(messages):
        if msg["role"] == "assistant":
            answered = True
        elif msg["role"] == "user":
            if not answered:
                out.append({"role": "assistant", "content": None})
            answered = False
        out.append(msg)
    return out[::-1]


STAND_IN = "(the target's answer)"  # an answer not generated yet, for the checks before


# What prepare_dataset calls each reason in its problems table (extract's errors table keeps the
# short reasons), and the fix it adds.
PROBLEM_KINDS = {"too_long": "prompt_too_long"}
FIXES = {
    "too_long": "shorten the prompt, or raise dataset.max_tokens",
    "assistant_first": "start the conversation with a user (or system) turn",
}
DEFAULT_FIX = "fix the conversation, or use a target whose chat template accepts it"


def unusable(
    tokenizer, messages: list[dict], max_tokens: int, answers_later: bool = False
) -> tuple[str, str] | None:
    """(kind, reason with its fix) when extraction could not use the conversation, else None:
    the same tokenization, so prepare_dataset refuses exactly what extraction would.
    `answers_later` (regeneration follows): checked as regeneration will leave it, with
    STAND_IN wherever the target answers (`answer_slots`)."""
    if answers_later:
        messages = [
            m if m["content"] is not None else {"role": "assistant", "content": STAND_IN}
            for m in answer_slots(messages)
        ]
    try:
        tokenize_chat(tokenizer, messages, max_tokens)
    except SampleError as exc:
        fix = FIXES.get(exc.reason, DEFAULT_FIX)
        return PROBLEM_KINDS.get(exc.reason, exc.reason), f"{exc.detail}; {fix}"
    return None
