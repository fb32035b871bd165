"""Real speculative decoding with a transformers target and the trained drafter (greedy, chain).

Each step the drafter proposes k tokens; the target reads the last accepted token and the k
drafts in one forward pass over its KV cache, accepts the longest prefix of drafts that equal
its own greedy choices, and adds one token of its own (the bonus: the correction after the
first wrong draft, or the next token when every draft is right). The rejected drafts' entries
are cropped from the target's cache. The output is therefore the target's plain greedy output,
token for token, whatever the drafter proposes; only the number of target passes changes.

The drafter follows the alignment of its training unroll (eyrie/train/model.py): row t pairs the
target's fused aux states at position t with token t+1 and sits at position t. After each
verify pass the rows of the accepted positions are appended to the drafter's own KV cache
("extend"); drafting then continues from the last row, one position further per draft, each
draft attending to the verified rows and to the drafts before it. The drafts' cache entries
are dropped again before the next extend, which recomputes those rows from the target's states.

Aux states are captured with forward hooks on the target's decoder layers during its passes
(aux id i = the output of decoder layer i), so the target runs once per step, unmodified.
"""

from __future__ import annotations

import inspect
import json
import time
from dataclasses import dataclass, field

import torch

from eyrie.common.errors import EyrieError
from eyrie.target.layers import check_aux_layer_ids, find_decoder_layers, hidden_state
from eyrie.train.model import apply_rope, rope_cos_sin


class SpeculateError(EyrieError, RuntimeError):
    """Speculative decoding cannot run as asked; the message names the input and the fix."""


# ---------------------------------------------------------------------------------------------
# the target: logits and aux states of one forward pass over its KV cache


class Target:
    """A loaded causal LM with hooks on its aux layers; ``forward`` extends a DynamicCache."""

    def __init__(self, model: torch.nn.Module, aux_layer_ids: list[int] | None = None):
        self.model = model.eval()
        self.aux_layer_ids = list(aux_layer_ids or [])
        _, layers = find_decoder_layers(model)
        if self.aux_layer_ids:
            try:
                check_aux_layer_ids(self.aux_layer_ids, len(layers))
            except ValueError as exc:
                raise SpeculateError(f"the drafter's aux_layer_ids: {exc}") from None
        self._seen: dict[int, torch.Tensor] = {}
        self._handles = [
            layers[i].register_forward_hook(self._hook(j)) for j, i in enumerate(self.aux_layer_ids)
        ]
        # transformers renamed the cache argument (past_key_values -> cache) within 5.x
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def _hook(self, slot: int):
        def hook(module, args, output):
            self._seen[slot] = hidden_state(output, SpeculateError)

        return hook

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.get_input_embeddings()(ids)

    def new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def forward(
        self, ids: list[int], cache, attention_mask=None, positions=None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits (T, V), aux (1, T, k, H) or None) of ``ids`` appended to ``cache``.

        A tree pass gives ``attention_mask`` (T, cached + T) bool, True where a token attends,
        and each token's ``positions``; by default the tokens follow the cache causally."""
        x = torch.tensor([ids], dtype=torch.long, device=self.device)
        extra = {self._cache_kw: cache}
        if attention_mask is not None:
            extra["attention_mask"] = attention_mask[None, None].to(self.device)
            extra["position_ids"] = torch.tensor([positions], device=self.device)
        self._seen = {}
        out = self.model(input_ids=x, use_cache=True, **extra)
        aux = None
        if self.aux_layer_ids:
            if len(self._seen) != len(self.aux_layer_ids):
                raise SpeculateError(
                    "the hooks on the target's aux layers did not fire: its forward does not run "
                    "through the decoder layers eyrie.target.layers found"
                )
            aux = torch.stack([self._seen[j] for j in range(len(self.aux_layer_ids))], dim=2)
        self._seen = {}
        return out.logits[0], aux

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def cache_length(cache) -> int:
    return int(cache.get_seq_length())


def crop_cache(cache, keep: int) -> None:
    """Keep the first ``keep`` positions (a negative crop removes tokens in every 5.x release)."""
    drop = cache_length(cache) - keep
    if drop > 0:
        cache.crop(-drop)


# ---------------------------------------------------------------------------------------------
# the drafter, one position at a time


class DraftRunner:
    """The trained drafter with a KV cache of verified rows, proposing chains of drafts.

    Uses the drafter's own modules; the attention is the training unroll's restricted to one
    chain: causal over the verified rows, then each draft over the drafts before it. Batch-1
    drafting is a string of tiny operations, so the per-draft work is kept to the minimum: keys
    and values live in buffers that grow by doubling (a crop only moves the length), only the
    key/value heads are stored (SDPA reads them grouped), and rotary angles come from a table.
    """

    def __init__(self, drafter, embed):
        self.d = drafter.eval()
        self.embed = embed
        self.cfg = drafter.config
        self._to_target: list[int] | None = None
        self.reset()

    def reset(self) -> None:
        self.k = self.v = None  # (1, kv heads, capacity, head_dim); rows [0, length) are valid
        self._len = 0
        self._cos = self._sin = None  # rotary table, (capacity, head_dim)
        self.last = None  # (1, 1, H): the last verified row's output, where drafting starts

    @property
    def length(self) -> int:
        return self._len

    def crop(self, keep: int) -> None:
        self._len = min(self._len, keep)

    def cached(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The valid keys and values, (1, kv heads, length, head_dim) each."""
        return self.k[:, :, : self._len], self.v[:, :, : self._len]

    def _reserve(self, rows: int, like: torch.Tensor) -> None:
        """Room for ``rows`` cached positions (buffers and rotary table), doubling as needed."""
        attn = self.d.midlayer.self_attn
        have = 0 if self.k is None else self.k.shape[2]
        if rows <= have:
            return
        cap = max(rows, 2 * have, 256)
        shape = (1, attn.nkv, cap, attn.hd)
        k, v = like.new_zeros(shape), like.new_zeros(shape)
        if self.k is not None:
            old_k, old_v = self.cached()
            k[:, :, : self._len], v[:, :, : self._len] = old_k, old_v
        self.k, self.v = k, v
        positions = torch.arange(cap, device=like.device)
        self._cos, self._sin = rope_cos_sin(positions, attn.hd, attn.theta, like.dtype)

    def _layer(
        self,
        hidden: torch.Tensor,
        tokens: torch.Tensor,
        start: int,
        positions: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The midlayer on rows at positions start.. (or ``positions``), appended to the cache;
        (1, T, H). ``mask`` (T, cached + T), True where a row attends, replaces the causal one."""
        layer, attn = self.d.midlayer, self.d.midlayer.self_attn
        T = tokens.shape[-1]
        x = torch.cat([layer.input_layernorm(self.embed(tokens)), layer.hidden_norm(hidden)], -1)
        q = attn.q_proj(x).view(1, T, attn.nh, attn.hd).transpose(1, 2)
        k = attn.k_proj(x).view(1, T, attn.nkv, attn.hd).transpose(1, 2)
        v = attn.v_proj(x).view(1, T, attn.nkv, attn.hd).transpose(1, 2)
        past = self._len
        self._reserve(past + T, q)  # positions never run past the rows cached
        at = slice(start, start + T) if positions is None else positions
        cos, sin = self._cos[at], self._sin[at]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        self.k[:, :, past : past + T], self.v[:, :, past : past + T] = k, v
        self._len = past + T
        if mask is None and T > 1:  # rows past.. attend causally: row i sees columns <= past + i
            rows = torch.arange(T, device=x.device)[:, None] + past
            mask = torch.arange(past + T, device=x.device)[None, :] <= rows
        out = torch.nn.functional.scaled_dot_product_attention(
            q,
            self.k[:, :, : self._len],
            self.v[:, :, : self._len],
            attn_mask=mask,
            enable_gqa=attn.nh != attn.nkv,
        )
        hidden = hidden + attn.o_proj(out.transpose(1, 2).reshape(1, T, attn.nh * attn.hd))
        return hidden + layer.mlp(layer.post_attention_layernorm(hidden))

    def target_ids(self) -> list[int]:
        """The target token id of each draft-vocabulary id, as a list (read once)."""
        if self._to_target is None:
            n = self.d.d2t.numel()
            self._to_target = self.d.draft_to_target(torch.arange(n, device=self.d.d2t.device))
            self._to_target = self._to_target.tolist()
        return self._to_target

    def rows(self, hidden, tokens, positions, mask) -> torch.Tensor:
        """Rows at arbitrary ``positions`` under an explicit ``mask`` (tree drafting)."""
        return self._layer(hidden, tokens, self._len, positions, mask)

    @torch.inference_mode()
    def extend(self, aux: torch.Tensor, next_tokens: list[int], start: int) -> None:
        """Add rows start.. : the target's aux states there, each with the token after it."""
        if start != self.length:
            raise SpeculateError(f"drafter cache holds {self.length} rows, extend asked at {start}")
        tokens = torch.tensor([next_tokens], dtype=torch.long, device=aux.device)
        hidden = self.d.fuse(aux.to(self.d.fc.weight.dtype))
        self.last = self._layer(hidden, tokens, start)[:, -1:]

    @torch.inference_mode()
    def chain_logits(self, tokens: list[int]) -> list[torch.Tensor]:
        """Draft-vocabulary logits of the drafts from the last row, feeding ``tokens`` as the
        drafts (len(tokens) + 1 logits); the drafts' cache entries are dropped afterwards."""
        verified = self.length
        hidden, out = self.last, [self.d.logits(self.last)[0, -1]]
        for j, tok in enumerate(tokens):
            t = torch.tensor([[tok]], dtype=torch.long, device=hidden.device)
            hidden = self._layer(hidden, t, verified + j)
            out.append(self.d.logits(hidden)[0, -1])
        self.crop(verified)
        return out

    @torch.inference_mode()
    def propose(self, n: int) -> list[int]:
        """n greedy drafts (target token ids) continuing the verified tokens."""
        verified = self.length
        hidden, drafts = self.last, []
        for j in range(n):
            draft = int(self.d.draft_to_target(self.d.logits(hidden)[0, -1].argmax()))
            drafts.append(draft)
            if j + 1 < n:
                t = torch.tensor([[draft]], dtype=torch.long, device=hidden.device)
                hidden = self._layer(hidden, t, verified + j)
        self.crop(verified)
        return drafts


# ---------------------------------------------------------------------------------------------
# decoding


@dataclass
class Generation:
    tokens: list[int]  # the new tokens (of every turn, in order)
    seconds: float
    accepted: list[int] = field(default_factory=list)  # drafts accepted per verify step
    turns: list[int] = field(default_factory=list)  # new tokens per turn; empty: one turn

    @property
    def verify_steps(self) -> int:
        return len(self.accepted)

    @property
    def turn_tokens(self) -> list[int]:
        """New tokens per turn decoded (each turn's first comes from its prefill)."""
        return self.turns or [len(self.tokens)]


def sync_device(device: torch.device) -> None:
    """Wait for the GPU's queued kernels, so the clock read next counts them."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cut_output(tokens: list[int], max_new: int, eos: set[int]) -> tuple[list[int], bool]:
    """Tokens cut after the first eos and at max_new; and whether generation is over."""
    for i, t in enumerate(tokens[:max_new]):
        if t in eos:
            return tokens[: i + 1], True
    return tokens[:max_new], len(tokens) >= max_new


def _prefill(target: Target, prompt: list[int]):
    """Start the clock and run the prompt into a new cache: (t0, cache, [first token], aux)."""
    sync_device(target.device)
    t0 = time.perf_counter()
    cache = target.new_cache()
    logits, aux = target.forward(prompt, cache)
    return t0, cache, [int(logits[-1].argmax())], aux


def greedy_generate(target: Target, prompt: list[int], max_new_tokens: int, eos=()) -> Generation:
    """Plain greedy decoding, one target pass per token over the same KV cache code path."""
    eos = set(eos)
    t0, cache, out, _ = _prefill(target, prompt)
    out, done = cut_output(out, max_new_tokens, eos)
    while not done:
        logits, _ = target.forward([out[-1]], cache)
        out, done = cut_output(out + [int(logits[-1].argmax())], max_new_tokens, eos)
    sync_device(target.device)
    return Generation(out, time.perf_counter() - t0)


def start_speculation(target: Target, drafter: DraftRunner, prompt, max_new_tokens: int, eos):
    """The prompt through the target and the drafter: (t0, cache, [first token], eos set,
    whether generation is already over)."""
    if not prompt:
        raise SpeculateError("an empty prompt cannot be decoded")
    eos = set(eos)
    t0, cache, out, aux = _prefill(target, prompt)
    drafter.reset()
    drafter.extend(aux, prompt[1:] + out, 0)
    out, done = cut_output(out, max_new_tokens, eos)
    return t0, cache, out, eos, done


def speculative_generate(
    target: Target, drafter: DraftRunner, prompt: list[int], k: int, max_new_tokens: int, eos=()
) -> Generation:
    """Greedy chain speculative decoding with k drafts per step; the output equals greedy's."""
    if k < 1:
        raise SpeculateError(f"evaluate.draft_tokens must be at least 1, got {k}")
    t0, cache, out, eos, done = start_speculation(target, drafter, prompt, max_new_tokens, eos)
    accepted: list[int] = []
    while not done:
        n = cache_length(cache)  # positions the target has seen; out[-1] sits at position n
        drafts = drafter.propose(k)
        logits, aux = target.forward([out[-1]] + drafts, cache)
        choice = logits.argmax(-1).tolist()  # choice[j]: the target's token after input j
        a = 0
        while a < k and drafts[a] == choice[a]:
            a += 1
        new = drafts[:a] + [choice[a]]
        crop_cache(cache, n + a + 1)
        drafter.extend(aux[:, : a + 1], new, n)
        accepted.append(a)
        out, done = cut_output(out + new, max_new_tokens, eos)
    sync_device(target.device)
    return Generation(out, time.perf_counter() - t0, accepted)


# ---------------------------------------------------------------------------------------------
# loading and prompts


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_pair(target_dir, drafter_dir, device, dtype: str = "float32", architecture=None):
    """(Target, DraftRunner or a DFlash BlockRunner, tokenizer, drafter.json) on ``device``,
    both in ``dtype``."""
    from eyrie.evaluate.acceptance import load_drafter
    from eyrie.target.load import load_model, load_tokenizer

    if dtype not in DTYPES:
        raise SpeculateError(f"evaluate.dtype {dtype!r} is not one of {sorted(DTYPES)}")
    model, _ = load_model(target_dir, device, architecture)
    model = model.to(device, DTYPES[dtype])
    if torch.device(device).type == "cuda":
        # cuDNN's attention plans each new key length on the host, and batch-1 decoding meets a
        # new one every step (benchmarks/RESULTS.md, "The transformers loop on the H200")
        torch.backends.cuda.enable_cudnn_sdp(False)
    drafter, meta = load_drafter(drafter_dir, device)
    drafter = drafter.to(dtype=DTYPES[dtype])
    text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else None
    vocab = getattr(text or model.config, "vocab_size", None)
    if vocab is not None and int(vocab) != drafter.config.vocab_size:
        raise SpeculateError(
            f"the target in {target_dir} has {vocab} tokens, the drafter in {drafter_dir} "
            f"{drafter.config.vocab_size}: it was trained for another target"
        )
    target = Target(model, meta["aux_layer_ids"])
    if meta.get("method") == "dflash":
        from eyrie.evaluate.block_runner import BlockRunner

        head = model.get_output_embeddings().weight
        return target, BlockRunner(drafter, target.embed, head), load_tokenizer(target_dir), meta
    return target, DraftRunner(drafter, target.embed), load_tokenizer(target_dir), meta


def load_prompts(jsonl, tokenizer, n: int, max_prompt_tokens: int = 512) -> list[dict]:
    """The first ``n`` conversations' prompts, turn by turn. Each of a conversation's answers
    (its assistant turns, and one after each user turn that none answers: MT-bench's second
    question, prompts-only data; eyrie.data.chat_tokens.answer_slots) is a turn the loop
    decodes. ``input_ids``: the first turn's prompt (the turns before the first answer,
    rendered with the chat template's generation prompt) as token ids, at most
    ``max_prompt_tokens``; ``messages``: those turns; ``follow_ups``: the turns asked before
    each later answer, which eyrie.evaluate.compare.decode_turns renders after the loop's own
    answers."""
    from eyrie.data.chat_tokens import answer_slots, render

    prompts = []
    with open(jsonl, encoding="utf-8") as f:
        for line in f:
            if len(prompts) >= n:
                break
            if not line.strip():
                continue
            rec = json.loads(line)
            turns: list[list[dict]] = [[]]  # the messages before each answer
            for m in answer_slots(rec.get("messages") or []):
                if m.get("role") == "assistant":
                    turns.append([])
                else:
                    turns[-1].append(m)
            if len(turns) < 2 or not turns[0]:
                continue  # no answer, or one before any question
            text = render(tokenizer, turns[0], add_generation_prompt=True)
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            if 0 < len(ids) <= max_prompt_tokens:
                prompts.append(
                    {
                        "id": str(rec.get("id", len(prompts))),
                        "input_ids": ids,
                        "messages": turns[0],
                        "follow_ups": turns[1:-1],
                    }
                )
    if not prompts:
        raise SpeculateError(
            f"{jsonl} gave no prompt (a conversation with a user turn before an assistant turn, "
            f"at most {max_prompt_tokens} tokens); check the held-out dataset"
        )
    return prompts


def eos_ids(tokenizer, model_config) -> list[int]:
    ids = getattr(model_config, "eos_token_id", None)
    ids = ids if isinstance(ids, list) else [ids]
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return sorted({int(i) for i in ids if i is not None})
