"""A tiny Llama written as a GGUF file with the `gguf` package, as llama.cpp lays one out:
llama metadata, Q8_0 (or F32) matrices, F32 norms, and a byte-level BPE tokenizer with a
ChatML template in ``tokenizer.ggml.*``. No output.weight: the head is tied to the embedding,
as in SmolLM2."""

from __future__ import annotations

from pathlib import Path

import numpy as np

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS = 64, 128, 2, 4, 2
HEAD_DIM = HIDDEN // HEADS
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "Ġ a", "i n"]
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _bytes_alphabet() -> list[str]:
    """GPT-2's printable spelling of the 256 bytes, in byte order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


def vocab() -> list[str]:
    merged = ["".join(m.split(" ")) for m in MERGES]
    return _bytes_alphabet() + merged + SPECIALS


def _tensors(rng: np.random.Generator, vocab_size: int) -> dict[str, np.ndarray]:
    def mat(rows, cols):
        return (rng.standard_normal((rows, cols)) * 0.1).astype(np.float32)

    def norm():
        return (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)

    out = {"token_embd.weight": mat(vocab_size, HIDDEN), "output_norm.weight": norm()}
    for i in range(LAYERS):
        b = f"blk.{i}"
        out |= {
            f"{b}.attn_norm.weight": norm(),
            f"{b}.attn_q.weight": mat(HEADS * HEAD_DIM, HIDDEN),
            f"{b}.attn_k.weight": mat(KV_HEADS * HEAD_DIM, HIDDEN),
            f"{b}.attn_v.weight": mat(KV_HEADS * HEAD_DIM, HIDDEN),
            f"{b}.attn_output.weight": mat(HIDDEN, HEADS * HEAD_DIM),
            f"{b}.ffn_norm.weight": norm(),
            f"{b}.ffn_gate.weight": mat(FFN, HIDDEN),
            f"{b}.ffn_up.weight": mat(FFN, HIDDEN),
            f"{b}.ffn_down.weight": mat(HIDDEN, FFN),
        }
    return out


def _metadata(w, tokens: list[str]) -> None:
    import gguf

    w.add_name("tiny-llama")
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_block_count(LAYERS)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    types = [gguf.TokenType.NORMAL] * (len(tokens) - len(SPECIALS))
    w.add_token_types(types + [gguf.TokenType.CONTROL] * len(SPECIALS))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(tokens.index("<|im_start|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_chat_template(TEMPLATE)


def write_tiny_llama(path: str | Path, quant: str = "Q8_0", seed: int = 0) -> Path:
    """Write the tiny Llama GGUF to `path`; matrices in `quant` (Q8_0 or F32)."""
    import gguf

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokens = vocab()
    qtype = gguf.GGMLQuantizationType[quant]
    w = gguf.GGUFWriter(str(path), "llama")
    _metadata(w, tokens)
    for name, data in _tensors(np.random.default_rng(seed), len(tokens)).items():
        if data.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
