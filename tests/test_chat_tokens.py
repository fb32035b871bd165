"""Loss masks from chat templates: exactly the assistant content and its end-of-turn marker."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tiny_target import CHAT_TEMPLATE, build_tokenizer, conversation

from eyrie.data.chat_tokens import SampleError, TemplateError, tokenize_chat

TOY = Path(__file__).resolve().parents[1] / "models" / "toy-llama"

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Rewrites every earlier turn once a later one exists: not prefix-stable.
UNSTABLE = (
    "{% for m in messages %}[{{ loop.length - loop.index }}]{{ m['role'] }}: {{ m['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}[0]assistant: {% endif %}"
)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    build_tokenizer(path)
    return path


@pytest.fixture
def tok(tok_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tok_dir)


@pytest.fixture(scope="module")
def chatml_tok(tmp_path_factory):
    from transformers import AutoTokenizer

    tok = build_tokenizer(tmp_path_factory.mktemp("chatml"))
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = CHATML
    path = tmp_path_factory.mktemp("chatml-saved")
    tok.save_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


def masked_runs(tokenizer, ids: np.ndarray, mask: np.ndarray) -> list[str]:
    """Decode each contiguous run of masked tokens (an independent view of the mask)."""
    runs, cur = [], []
    for t, m in zip(ids.tolist(), mask.tolist(), strict=True):
        if m:
            cur.append(t)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return [tokenizer.decode(r, skip_special_tokens=False) for r in runs]


def reference_ids(tokenizer, messages) -> list[int]:
    out = tokenizer.apply_chat_template(messages, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.mark.parametrize("template_fixture,end", [("tok", "<|end|>"), ("chatml_tok", "<|im_end|>")])
@pytest.mark.parametrize("i,turns", [(0, 1), (4, 1), (7, 3), (11, 2)])
def test_mask_is_assistant_content_and_end_marker(request, template_fixture, end, i, turns):
    tokenizer = request.getfixturevalue(template_fixture)
    msgs = conversation(i, turns)
    t = tokenize_chat(tokenizer, msgs, max_tokens=10_000)
    assert t.input_ids.dtype == np.int32 and t.loss_mask.dtype == np.uint8
    assert t.input_ids.tolist() == reference_ids(tokenizer, msgs)
    expected = [m["content"] + end for m in msgs if m["role"] == "assistant"]
    assert masked_runs(tokenizer, t.input_ids, t.loss_mask) == expected
    assert t.full_length == len(t.input_ids)


def test_truncation_keeps_prefix_and_mask(tok):
    msgs = conversation(9, 3)
    full = tokenize_chat(tok, msgs, max_tokens=10_000)
    first = int(np.argmax(full.loss_mask))
    cut = tokenize_chat(tok, msgs, max_tokens=first + 3)
    assert len(cut.input_ids) == first + 3
    assert cut.input_ids.tolist() == full.input_ids[: first + 3].tolist()
    assert cut.loss_mask.tolist() == full.loss_mask[: first + 3].tolist()
    assert cut.full_length == len(full.input_ids)


def test_no_assistant_token_after_truncation_is_an_error(tok):
    msgs = conversation(9, 1)
    first = int(np.argmax(tokenize_chat(tok, msgs, 10_000).loss_mask))
    with pytest.raises(SampleError) as err:
        tokenize_chat(tok, msgs, max_tokens=first)
    assert err.value.reason == "too_long"


def test_conversation_without_assistant_is_an_error(tok):
    with pytest.raises(SampleError) as err:
        tokenize_chat(tok, [{"role": "user", "content": "hi"}], max_tokens=100)
    assert err.value.reason == "empty_mask"


def test_assistant_first_is_an_error(tok):
    msgs = [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "yo"}]
    with pytest.raises(TemplateError) as err:
        tokenize_chat(tok, msgs, max_tokens=100)
    assert err.value.reason == "assistant_first"


def test_unstable_template_is_refused(tok):
    tok.chat_template = UNSTABLE
    with pytest.raises(TemplateError) as err:
        tokenize_chat(tok, conversation(2, 2), max_tokens=1000)
    assert err.value.reason == "not_prefix_stable"
    assert "prefix-stable" in str(err.value)


def test_broken_template_is_a_sample_error(tok):
    tok.chat_template = "{{ messages[0]['nope'] + 1 }}"
    with pytest.raises(TemplateError) as err:
        tokenize_chat(tok, conversation(1), max_tokens=100)
    assert err.value.reason == "template_error"


def test_test_template_is_the_toy_template():
    assert CHAT_TEMPLATE == (
        "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    )


@pytest.mark.skipif(not (TOY / "tokenizer.json").is_file(), reason="models/toy-llama not built")
def test_shipped_toy_tokenizer():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(TOY)
    for i, turns in [(0, 1), (5, 2), (8, 3)]:
        msgs = conversation(i, turns)
        t = tokenize_chat(tokenizer, msgs, max_tokens=100_000)
        assert t.input_ids.tolist() == reference_ids(tokenizer, msgs)
        expected = [m["content"] + "<|end|>" for m in msgs if m["role"] == "assistant"]
        assert masked_runs(tokenizer, t.input_ids, t.loss_mask) == expected
