"""The capture's forward as CUDA graphs (eyrie.extract.graphs): bucketed batches and the 4-D mask
against transformers' own output_hidden_states, the setting's checks, the fallback, and on a
GPU the graphs against the eager capture and a whole job's store against the eager job's."""

from __future__ import annotations

import logging

import pytest
import torch
from test_capture_hf import LENGTHS, check_against_reference, load, reference, sequences
from test_extract import CAPTURE, EXTRACT, run
from tiny_target import build_deepseek, build_llama, write_split

import eyrie.extract.graphs as graphs
from eyrie.extract.graphs import (
    GraphCaptureFailed,
    GraphForward,
    bucket_of,
    too_large_for_auto,
    why_not_graphs,
)
from eyrie.extract.hf import CaptureError, HFCapture, cuda_graphs_for
from eyrie.store.reader import ShardReader

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return load(build_llama(tmp_path_factory.mktemp("llama"), layers=8))


def test_bucket_of():
    assert [bucket_of(n, 16) for n in (1, 15, 16, 17, 33)] == [16, 16, 16, 32, 48]


@pytest.mark.parametrize("bucket", [1, 16, 64])
def test_bucketed_forward_matches_output_hidden_states(llama, bucket):
    """On the CPU the bucketed body runs eagerly: the padding to the bucket and the full batch,
    the 4-D mask and the decoder without lm_head give transformers' own states (lengths 1 to
    33 in one batch of 5 padded to 8 rows)."""
    check_against_reference(
        llama, [1, 3, 4], cuda_graphs=True, batch_size=len(LENGTHS) + 3, bucket_tokens=bucket
    )


def test_bucketed_forward_with_eager_attention_matches(tmp_path):
    """transformers' eager attention takes the mask as additive scores, not booleans."""
    model = load(build_llama(tmp_path, layers=8))
    model.config._attn_implementation = "eager"
    check_against_reference(model, [1, 3, 4], cuda_graphs=True, batch_size=8, bucket_tokens=16)


def test_bucketed_deepseek_mla_moe_matches(tmp_path):
    check_against_reference(
        load(build_deepseek(tmp_path)), [0, 2, 3], cuda_graphs=True, batch_size=5
    )


def test_a_mask_ignored_would_be_caught(llama, monkeypatch):
    """The reference check can fail: a 4-D mask without its causal part lets tokens see later
    ones. (Right padding alone changes nothing a causal mask does not already hide.)"""
    import eyrie.extract.hf as hf

    def padding_only(mask, dtype):
        t = mask.shape[1]
        return mask[:, None, None, :].bool().expand(-1, 1, t, t)

    monkeypatch.setattr(hf, "attention_mask_4d", padding_only)
    with pytest.raises(AssertionError):
        check_against_reference(llama, [1, 3, 4], cuda_graphs=True, batch_size=8)


def test_a_batch_larger_than_the_graphs_is_refused(llama):
    with HFCapture(llama, [1], cuda_graphs=True, batch_size=2) as cap:
        with pytest.raises(ValueError, match="a batch of 3 rows; the graphs hold 2"):
            cap.capture(sequences(llama.config.vocab_size)[:3])


def test_the_setting_is_resolved_with_reasons(llama, monkeypatch):
    cpu = torch.device("cpu")
    assert cuda_graphs_for("auto", llama, cpu) is False
    assert cuda_graphs_for(False, llama, cpu) is False
    with pytest.raises(
        CaptureError, match="capture.cuda_graphs is true, but the target runs on cpu"
    ):
        cuda_graphs_for(True, llama, cpu)
    with pytest.raises(CaptureError, match="capture.cuda_graphs: 'yes'; use auto, true or false"):
        cuda_graphs_for("yes", llama, cpu)
    gpu = torch.device("cuda")
    assert why_not_graphs(llama, gpu) is None
    assert too_large_for_auto(llama) is None
    monkeypatch.setattr(graphs, "GRAPHS_AUTO_MAX_PARAMS", 1000)  # the tiny Llama is "large"
    assert "B parameters: a forward this large" in too_large_for_auto(llama)
    original = llama.config._attn_implementation
    try:
        llama.config._attn_implementation = "flash_attention_2"
        assert "takes no 4-D mask" in why_not_graphs(llama, gpu)
    finally:
        llama.config._attn_implementation = original


def test_a_failed_graph_falls_back_under_auto_and_stops_under_true(llama, monkeypatch, caplog):
    """auto: the job goes on with the eager forward, and says so; true: an error that names the
    setting and the fix. (The eager states after the fallback still match the reference.)"""

    def fail(self, ids, mask):
        raise GraphCaptureFailed("capturing a CUDA graph of the forward failed (test)")

    monkeypatch.setattr(GraphForward, "run", fail)
    seqs = sequences(llama.config.vocab_size)
    with HFCapture(llama, [1, 3], cuda_graphs=True, batch_size=8) as cap:
        with pytest.raises(CaptureError, match="set capture.cuda_graphs to auto"):
            cap.capture(seqs)
    with caplog.at_level(logging.WARNING, logger="eyrie.extract.hf"):
        with HFCapture(llama, [1, 3], cuda_graphs="auto", batch_size=8) as cap:
            got = cap.capture(seqs)
            assert cap.graph_stats == (0, 0.0)
    assert "the forward runs eagerly from here on" in caplog.text
    for seq, (aux, final) in zip(seqs, got, strict=True):
        hs, ref_final = reference(llama, seq)
        torch.testing.assert_close(aux[:, 1], hs[4].bfloat16())
        torch.testing.assert_close(final, ref_final.bfloat16())


def test_a_job_asking_for_graphs_on_the_cpu_stops_before_capturing(tmp_path):
    root = tmp_path / "setup"
    target = build_llama(root / "target", layers=8)
    data = write_split(root / "train.jsonl", 6)
    with pytest.raises(CaptureError, match="capture.cuda_graphs is true"):
        run((root, target, data), tmp_path / "out", capture={**CAPTURE, "cuda_graphs": True})


@pytest.mark.gpu
@cuda
def test_cuda_graphs_match_the_eager_capture_and_the_reference(tmp_path):
    model = load(build_llama(tmp_path, layers=8), device="cuda", dtype=torch.bfloat16)
    seqs = sequences(model.config.vocab_size)
    with HFCapture(model, [1, 3, 4]) as eager:
        want = eager.capture(seqs)
    with HFCapture(model, [1, 3, 4], cuda_graphs=True, batch_size=8, bucket_tokens=16) as cap:
        got = cap.capture(seqs)
        again = cap.capture(seqs[::-1])  # the same buckets replayed, rows in another order
        assert cap.graph_stats[0] == 1  # one batch, one bucket (48 tokens)
    for seq, (a, f), (wa, wf), (ra, rf) in zip(seqs, got, want, again[::-1], strict=True):
        hs, ref_final = reference(model, seq)
        for j, layer in enumerate([1, 3, 4]):
            cos = torch.nn.functional.cosine_similarity(a[:, j].float(), hs[layer + 1], dim=-1)
            assert cos.min() > 0.999
        torch.testing.assert_close(a, wa)  # bf16 tolerance: padding may change kernels
        torch.testing.assert_close(f, wf)
        torch.testing.assert_close(ra, a)
        torch.testing.assert_close(rf, f)


@pytest.mark.gpu
@cuda
def test_cuda_job_with_graphs_stores_what_the_eager_job_stores(tmp_path):
    root = tmp_path / "setup"
    target = build_llama(root / "target", layers=8)
    data = write_split(root / "train.jsonl", 24)
    stores = {}
    for use in (False, True):
        out = tmp_path / f"graphs-{use}"
        capture = {**CAPTURE, "device": "cuda", "cuda_graphs": use, "graph_bucket_tokens": 16}
        outcome = run((root, target, data), out, capture=capture, extract=EXTRACT)
        assert ("graph_capture" in outcome.seconds) is use
        stores[use] = ShardReader(out / "shard-000.zarr")
    assert list(stores[False].sample_ids) == list(stores[True].sample_ids)
    for i in range(len(stores[False])):
        a, b = stores[False][i], stores[True][i]
        assert torch.equal(a["input_ids"], b["input_ids"])
        for key in ("aux_hidden", "final_hidden"):
            # other shapes, other kernels: a bf16 step of the state's scale, cosines ~1
            want, got = a[key].float(), b[key].float()
            step = 2.0**-7 * want.abs().max().item()
            torch.testing.assert_close(got, want, rtol=1.6e-2, atol=step)
            cos = torch.nn.functional.cosine_similarity(got, want, dim=-1)
            assert cos.min() > 0.9999


@pytest.mark.gpu
@cuda
def test_cuda_graphs_flag_the_row_the_model_makes_non_finite(tmp_path):
    """The finite flags are made inside the graph: a NaN in one token's embedding (read at
    every replay, unlike a Python hook) marks that row and no other."""
    model = load(build_llama(tmp_path, layers=8), device="cuda", dtype=torch.bfloat16)
    seqs = sequences(model.config.vocab_size)
    counts = {}
    for seq in seqs:
        for tok in set(seq.tolist()):
            counts[tok] = counts.get(tok, 0) + 1
    row = 3  # the longest sequence: a token found in it alone
    token = next(t for t in seqs[row].tolist() if counts[t] == 1)
    with torch.no_grad():
        model.get_input_embeddings().weight[token, 0] = float("nan")
    with HFCapture(model, [1, 3, 4], cuda_graphs=True, batch_size=8, bucket_tokens=16) as cap:
        rows = cap.capture_pending(seqs).result()
    assert [flag for *_, flag in rows] == [r != row for r in range(len(seqs))]
