"""Hook capture against transformers' own output_hidden_states, per layer, batched and padded."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_target import build_deepseek, build_llama

from eyrie.extract.hf import CaptureError, HFCapture

LENGTHS = [5, 17, 1, 33, 9]


def load(path, device="cpu", dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model.to(device).eval()


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return load(build_llama(tmp_path_factory.mktemp("llama"), layers=8))


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    return load(build_deepseek(tmp_path_factory.mktemp("deepseek")))


def sequences(vocab: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, size=n).astype(np.int32) for n in LENGTHS]


def reference(model, seq) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """hidden_states[i + 1] is the output of layer i; hidden_states[-1] is after the final norm."""
    ids = torch.as_tensor(seq, dtype=torch.long, device=model.device)[None]
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True)
    return [h[0].float().cpu() for h in out.hidden_states], out.hidden_states[-1][0].float().cpu()


def check_against_reference(model, aux_ids, **capture_kw):
    seqs = sequences(model.config.vocab_size)
    with HFCapture(model, aux_ids, pad_token_id=0, **capture_kw) as cap:
        got = cap.capture(seqs)
    assert len(got) == len(seqs)
    for seq, (aux, final) in zip(seqs, got, strict=True):
        hs, ref_final = reference(model, seq)
        assert aux.dtype == final.dtype == torch.bfloat16
        assert aux.shape == (len(seq), len(aux_ids), model.config.hidden_size)
        assert final.shape == (len(seq), model.config.hidden_size)
        # bf16 tolerances (rtol 1.6e-2): the reference rounded to bf16, one ulp of slack for
        # the rare rounding flip that batching and padding cause.
        for j, layer in enumerate(aux_ids):
            torch.testing.assert_close(aux[:, j], hs[layer + 1].bfloat16())
            if len(seq) > 1:  # the input of the layer is a different thing
                assert not torch.allclose(aux[:, j], hs[layer].bfloat16(), rtol=0.1, atol=0.1)
        torch.testing.assert_close(final, ref_final.bfloat16())


def test_llama_layers_and_final_match_output_hidden_states(llama):
    check_against_reference(llama, [1, 3, 4])


def test_llama_first_and_last_layer(llama):
    check_against_reference(llama, [0, 6])


def test_deepseek_mla_moe_matches(deepseek):
    check_against_reference(deepseek, [0, 2, 3])


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_the_4d_mask_built_here_gives_the_states_of_transformers_own(llama, attention):
    """mask_4d (the default on CUDA) hands the model the causal-and-padding mask itself; the
    padded rows must still come out as each sequence's unbatched forward."""
    before = llama.config._attn_implementation
    llama.set_attn_implementation(attention)
    try:
        check_against_reference(llama, [1, 3, 4], mask_4d=True)
    finally:
        llama.set_attn_implementation(before)


def test_a_wrong_4d_mask_is_caught_by_the_reference(llama, monkeypatch):
    """The check above can fail: a mask without its causal part lets each token see the ones
    after it. (With right padding, padding comes after every real token, so a mask that let
    padding through would change nothing the capture keeps.)"""
    import eyrie.extract.hf as hf

    def not_causal(mask, dtype=None):
        t = mask.shape[1]
        return mask[:, None, None, :].bool().expand(-1, 1, t, t)

    monkeypatch.setattr(hf, "attention_mask_4d", not_causal)
    with pytest.raises(AssertionError):
        check_against_reference(llama, [1, 3, 4], mask_4d=True)


def test_batch_rows_do_not_depend_on_batch_company(llama):
    seqs = sequences(llama.config.vocab_size, seed=3)
    with HFCapture(llama, [1, 3]) as cap:
        together = cap.capture(seqs)
        alone = [cap.capture([s])[0] for s in seqs]
    for (a1, f1), (a2, f2) in zip(together, alone, strict=True):
        torch.testing.assert_close(a1, a2)
        torch.testing.assert_close(f1, f2)


def test_lm_head_is_not_run(llama):
    calls = []
    handle = llama.lm_head.register_forward_hook(lambda *a: calls.append(1))
    try:
        with HFCapture(llama, [1]) as cap:
            cap.capture(sequences(llama.config.vocab_size)[:2])
        assert calls == []
        with HFCapture(llama, [1], stop_at_final_norm=False) as cap:
            cap.capture(sequences(llama.config.vocab_size)[:2])
        assert calls == [1]
    finally:
        handle.remove()


def test_hooks_are_removed_on_close(llama):
    before = sum(len(m._forward_hooks) for m in llama.modules())
    with HFCapture(llama, [1, 2]):
        assert sum(len(m._forward_hooks) for m in llama.modules()) == before + 3
    assert sum(len(m._forward_hooks) for m in llama.modules()) == before


def test_a_capture_left_open_does_not_touch_other_forwards(llama):
    """Hooks record only during their own capture's forward: an open capture neither stops nor
    keeps the states of the model's other forwards, so two captures can coexist."""
    seqs = sequences(llama.config.vocab_size)[:2]
    with HFCapture(llama, [1, 3]) as first, HFCapture(llama, [2]) as second:
        ids = torch.as_tensor(seqs[0], dtype=torch.long)[None]
        with torch.no_grad():
            logits = llama(input_ids=ids).logits  # runs to the lm_head: nothing stops it
        assert logits.shape[-1] == llama.config.vocab_size
        assert first._aux == {} and first._final == [] and second._final == []
        got = first.capture(seqs)
        alone = second.capture(seqs)
    for seq, (aux, _), (aux2, _) in zip(seqs, got, alone, strict=True):
        hs, _ = reference(llama, seq)
        torch.testing.assert_close(aux[:, 0], hs[2].bfloat16())
        torch.testing.assert_close(aux2[:, 0], hs[3].bfloat16())


@pytest.mark.parametrize("ids", [[8], [1, 1], [-1]])
def test_bad_layer_ids_are_refused(llama, ids):
    with pytest.raises(CaptureError, match="aux_layer_ids"):
        HFCapture(llama, ids)


def test_bypassed_layers_are_caught(tmp_path):
    """A forward that does not run the hooked modules fails loudly instead of storing nothing."""
    model = load(build_llama(tmp_path, layers=8))
    cap = HFCapture(model, [1, 3])
    model.model.layers = torch.nn.ModuleList(
        [type(m)(model.config, i) for i, m in enumerate(model.model.layers)]
    )
    with pytest.raises(CaptureError, match="fired 0 times"):
        cap.capture(sequences(model.config.vocab_size)[:1])
    cap.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bf16_matches(tmp_path):
    model = load(build_llama(tmp_path, layers=8), device="cuda", dtype=torch.bfloat16)
    seqs = sequences(model.config.vocab_size)
    with HFCapture(model, [1, 3, 4]) as cap:
        got = cap.capture(seqs)
    for seq, (aux, final) in zip(seqs, got, strict=True):
        hs, ref_final = reference(model, seq)
        for j, layer in enumerate([1, 3, 4]):
            cos = torch.nn.functional.cosine_similarity(aux[:, j].float(), hs[layer + 1], dim=-1)
            assert cos.min() > 0.999
        cos = torch.nn.functional.cosine_similarity(final.float(), ref_final, dim=-1)
        assert cos.min() > 0.999
