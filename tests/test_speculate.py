"""Speculative decoding equals greedy decoding; the drafter's cache follows its training unroll;
the online SGLang client starts, measures and always stops a (fake) server."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import pytest
import torch
from fake_sglang import fake_server
from tiny_target import build_llama

from eyrie.evaluate import compare as cmp
from eyrie.evaluate import online
from eyrie.evaluate.compare import interleaved, rows_of, summarize
from eyrie.evaluate.draft_runner import DraftRunner
from eyrie.evaluate.speculate import Generation, greedy_generate, speculative_generate
from eyrie.evaluate.target_runner import SpeculateError, Target
from eyrie.train.model import Drafter, DrafterConfig

TOY = Path(__file__).resolve().parents[1] / "models" / "toy-llama"
AUX = [1, 2, 3]


def untrained_drafter(cfg: dict, aux=AUX, seed=0) -> Drafter:
    torch.manual_seed(seed)
    d = DrafterConfig.from_target(cfg, num_aux=len(aux), draft_vocab_size=cfg["vocab_size"] // 2)
    model = Drafter(d)
    tokens = torch.arange(0, cfg["vocab_size"], 2)  # every other token: d2t[i] = i
    t2d = torch.zeros(cfg["vocab_size"], dtype=torch.bool)
    t2d[tokens] = True
    model.set_vocab(tokens - torch.arange(len(tokens)), t2d)
    return model.eval()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Batch-1 decoding of tiny matrices: threads only contend (much slower on a busy CPU)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM

    folder = build_llama(tmp_path_factory.mktemp("spec") / "t", layers=6, hidden=32)
    cfg = json.loads((folder / "config.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    target = Target(model, AUX)
    yield target, DraftRunner(untrained_drafter(cfg), target.embed), cfg
    target.close()


@torch.no_grad()
def reference_greedy(model, prompt, n):
    """Greedy decoding with full forward passes and no cache (independent of the code tested)."""
    ids = list(prompt)
    for _ in range(n):
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits
        ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt) :]


PROMPTS = [[1, 40, 41, 42], [1, 7], [1, 200, 13, 99, 54, 3, 3, 3, 18]]


def test_greedy_matches_a_cacheless_reference(tiny):
    target, _, _ = tiny
    for p in PROMPTS:
        assert greedy_generate(target, p, 12).tokens == reference_greedy(target.model, p, 12)


@pytest.mark.parametrize("k", [1, 2, 5])
def test_untrained_drafter_is_rejected_and_output_is_greedy(tiny, k):
    target, runner, _ = tiny
    for p in PROMPTS:
        plain = greedy_generate(target, p, 20)
        spec = speculative_generate(target, runner, p, k, 20)
        assert spec.tokens == plain.tokens
        assert len(spec.tokens) == 20 and spec.verify_steps == 19
        assert sum(spec.accepted) <= 2  # a random drafter: (almost) every draft rejected


class ForcedDrafts(DraftRunner):
    """The real drafter runs (and keeps its cache), but its drafts are replaced by the true
    greedy continuation with the draft at ``wrong(step)`` corrupted: a known acceptance."""

    def __init__(self, runner, sequence, wrong):
        super().__init__(runner.d, runner.embed)
        self.sequence, self.wrong, self.steps = sequence, wrong, 0

    def propose(self, n):
        super().propose(n)
        at = self.length  # the last verified token sits at position `at`
        drafts = list(self.sequence[at + 1 : at + 1 + n])
        drafts += [0] * (n - len(drafts))
        w = self.wrong(self.steps)
        if w < n:
            drafts[w] = (drafts[w] + 1) % 50 + 3
        self.steps += 1
        return drafts


@pytest.mark.parametrize("k", [1, 3, 4])
def test_partial_acceptance_keeps_output_and_caches_right(tiny, k):
    target, runner, _ = tiny
    prompt = PROMPTS[2]
    n_new = 40
    plain = greedy_generate(target, prompt, n_new)
    sequence = prompt + plain.tokens + [0] * 8
    forced = ForcedDrafts(runner, sequence, wrong=lambda step: step % (k + 2))
    spec = speculative_generate(target, forced, prompt, k, n_new)
    assert spec.tokens == plain.tokens
    want = [min(s % (k + 2), k) for s in range(len(spec.accepted))]
    assert spec.accepted[:-1] == want[:-1]  # the last step may be cut by max_new_tokens
    assert 0 < sum(spec.accepted) and min(spec.accepted) == 0

    # the drafter's cache after the run equals rows computed from scratch in one extend
    # (the last step's rows may reach past the tokens max_new_tokens kept: compare the rest)
    full = prompt + spec.tokens
    rows = min(forced.length, len(full) - 1)
    assert rows > len(prompt) + n_new // 2
    _, aux = target.forward(full[:rows], target.new_cache())
    fresh = DraftRunner(runner.d, runner.embed)
    fresh.extend(aux, full[1 : rows + 1], 0)
    (k, v), (fresh_k, fresh_v) = forced.cached(), fresh.cached()
    assert fresh_k.shape[2] == rows
    assert torch.allclose(k[:, :, :rows], fresh_k, atol=1e-5)
    assert torch.allclose(v[:, :, :rows], fresh_v, atol=1e-5)


def test_draft_runner_follows_the_training_unroll(tiny):
    """Row t's step-k logits from the incremental runner equal Drafter.forward's."""
    target, runner, cfg = tiny
    ids = torch.tensor([[1, 50, 51, 52, 90, 91, 5, 6, 7, 8, 9, 10]])
    T, K = ids.shape[1], 4
    cache = target.new_cache()
    _, aux = target.forward(ids[0].tolist(), cache)
    with torch.no_grad():
        want = runner.d(aux, ids, target.embed, K)
    for t in range(T - K - 1):
        r = DraftRunner(runner.d, runner.embed)
        r.extend(aux[:, : t + 1], ids[0, 1 : t + 2].tolist(), 0)
        got = r.chain_logits(ids[0, t + 2 : t + K + 1].tolist())  # step k is fed x_{t+k+1}
        assert r.length == t + 1  # the drafts' entries were dropped
        for k in range(K):
            assert torch.allclose(got[k], want[k][0, t], atol=1e-4), (t, k)


def test_eos_stops_both_alike(tiny):
    target, runner, _ = tiny
    plain = greedy_generate(target, PROMPTS[0], 15)
    eos = plain.tokens[6]
    cut = plain.tokens[: plain.tokens.index(eos) + 1]
    assert greedy_generate(target, PROMPTS[0], 15, eos=[eos]).tokens == cut
    assert speculative_generate(target, runner, PROMPTS[0], 3, 15, eos=[eos]).tokens == cut
    with pytest.raises(SpeculateError, match="at least 1"):
        speculative_generate(target, runner, PROMPTS[0], 0, 15)


@pytest.mark.skipif(not (TOY / "model.safetensors").is_file(), reason="toy-llama not built")
def test_toy_target_speculation_is_greedy():
    from eyrie.evaluate.loading import load_prompts
    from eyrie.target.load import load_model, load_tokenizer

    model, _ = load_model(TOY, torch.device("cpu"))
    cfg = json.loads((TOY / "config.json").read_text())
    target = Target(model, [1, 3, 4])
    runner = DraftRunner(untrained_drafter(cfg, [1, 3, 4]), target.embed)
    data = Path(__file__).resolve().parents[1] / "data" / "chat" / "heldout.jsonl"
    prompts = load_prompts(data, load_tokenizer(TOY), 2)
    try:
        for p, k in zip(prompts, [1, 4], strict=True):
            plain = greedy_generate(target, p["input_ids"], 12)
            spec = speculative_generate(target, runner, p["input_ids"], k, 12)
            assert spec.tokens == plain.tokens, p["id"]
    finally:
        target.close()


def test_summary_counts_emitted_tokens_per_verify_pass():
    rows = [
        {"new_tokens": 9, "plain_s": 2.0, "spec_s": 1.0, "accepted": [3, 0, 3], "identical": True},
        {"new_tokens": 3, "plain_s": 1.0, "spec_s": 2.0, "accepted": [1], "identical": False},
    ]
    s = summarize(rows, k=3)
    assert s["accept_length"] == pytest.approx((8 + 2) / 4)
    assert s["accept_histogram"] == [1, 1, 0, 2]
    assert s["speedup"] == pytest.approx((12 / 3) / (12 / 3))
    assert s["identical"] == 1


def test_plain_and_speculative_interleave_prompt_by_prompt_flipping_each_repeat():
    calls = []

    def stand_in(kind):
        def run(p):
            calls.append((kind, p["id"]))
            return Generation([1, 2], 1.0)

        return run

    prompts = [{"id": "a", "input_ids": [1]}, {"id": "b", "input_ids": [2]}]
    runs = interleaved(prompts, stand_in("plain"), stand_in("spec"), repeats=3)
    assert calls == [
        ("plain", "a"), ("spec", "a"), ("plain", "b"), ("spec", "b"),
        ("spec", "a"), ("plain", "a"), ("spec", "b"), ("plain", "b"),
        ("plain", "a"), ("spec", "a"), ("plain", "b"), ("spec", "b"),
    ]  # fmt: skip
    assert len(runs) == 3 and all(len(run) == 2 for run in runs)
    with pytest.raises(SpeculateError, match="evaluate.repeats must be at least 1"):
        interleaved(prompts, stand_in("plain"), stand_in("spec"), repeats=0)


def test_compare_times_interleaved_after_an_untimed_warmup(tiny, monkeypatch):
    """compare itself: the warm-up pair (short, untimed), then the pairs in the flipping order."""
    target, runner, _ = tiny
    calls = []

    def recorded(kind, real):
        def run(*args):
            out = real(*args)
            calls.append((kind, tuple(args[-4 if kind == "spec" else -3]), args[-2]))
            return out

        return run

    monkeypatch.setattr(cmp, "greedy_generate", recorded("plain", greedy_generate))
    monkeypatch.setattr(cmp, "speculative_generate", recorded("spec", speculative_generate))
    prompts = [{"id": str(i), "input_ids": p} for i, p in enumerate(PROMPTS[:2])]
    rec = cmp.compare(target, runner, prompts, k=2, max_new_tokens=10, repeats=2)
    a, b = tuple(PROMPTS[0]), tuple(PROMPTS[1])
    assert calls == [
        ("plain", a, 8), ("spec", a, 8),  # the warm-up: one prompt each way, 8 tokens
        ("plain", a, 10), ("spec", a, 10), ("plain", b, 10), ("spec", b, 10),
        ("spec", a, 10), ("plain", a, 10), ("spec", b, 10), ("plain", b, 10),
    ]  # fmt: skip
    assert rec["repeats"] == 2 and rec["plain_first"] == [True, False]
    assert rec["identical"] == 2 and rec["new_tokens"] == 20
    assert all(r["identical_repeats"] == [True, True] for r in rec["rows"])
    assert len(rec["speedup_repeats"]) == 2
    assert rec["speedup_min"] <= rec["speedup"] <= rec["speedup_max"]


def _runs(times, tokens=(5, 6)):
    """runs[r][i] from {(r, i): (plain_s, spec_s)}; every output the same tokens."""
    n_rep = 1 + max(r for r, _ in times)
    n_p = 1 + max(i for _, i in times)
    return [
        [
            (
                Generation(list(range(tokens[i])), times[r, i][0]),
                Generation(list(range(tokens[i])), times[r, i][1], [1] * (tokens[i] - 1)),
            )
            for i in range(n_p)
        ]
        for r in range(n_rep)
    ]


PAIR_PROMPTS = [{"id": "a", "input_ids": [1, 2]}, {"id": "b", "input_ids": [3]}]


def test_median_and_spread_over_repeats_from_known_timings():
    # per repeat: plain totals 4, 6, 9; spec totals 5, 4, 6 -> speed-ups 0.8, 1.5, 1.5
    times = {
        (0, 0): (1.0, 2.0), (0, 1): (3.0, 3.0),
        (1, 0): (2.0, 1.0), (1, 1): (4.0, 3.0),
        (2, 0): (4.0, 4.0), (2, 1): (5.0, 2.0),
    }  # fmt: skip
    s = summarize(rows_of(PAIR_PROMPTS, _runs(times)), k=3)
    assert s["repeats"] == 3 and s["timing"] == "interleaved"
    assert s["plain_seconds_repeats"] == pytest.approx([4.0, 6.0, 9.0])
    assert s["spec_seconds_repeats"] == pytest.approx([5.0, 4.0, 6.0])
    assert s["speedup_repeats"] == pytest.approx([0.8, 1.5, 1.5])
    assert s["speedup"] == pytest.approx(1.5)
    assert (s["speedup_min"], s["speedup_max"]) == pytest.approx((0.8, 1.5))
    assert s["plain_seconds"] == pytest.approx(6.0) and s["spec_seconds"] == pytest.approx(5.0)
    assert s["plain_tokens_per_s"] == pytest.approx(11 / 6.0)
    assert s["spec_tokens_per_s"] == pytest.approx(11 / 5.0)
    assert [r["plain_s"] for r in s["rows"]] == pytest.approx([2.0, 4.0])  # per-prompt medians
    assert [r["spec_s"] for r in s["rows"]] == pytest.approx([2.0, 3.0])
    assert s["rows"][1]["spec_s_repeats"] == pytest.approx([3.0, 3.0, 2.0])
    assert s["identical"] == 2 and s["prompts"] == 2 and s["new_tokens"] == 11
    # an even number of repeats: the median is the mean of the middle two
    four = {**times, (3, 0): (1.0, 1.0), (3, 1): (1.0, 1.0)}  # speed-up 1.0
    s4 = summarize(rows_of(PAIR_PROMPTS, _runs(four)), k=3)
    assert s4["speedup"] == pytest.approx((1.0 + 1.5) / 2)
    assert s4["plain_first"] == [True, False, True, False]


def test_a_mismatch_in_any_repeat_makes_the_prompt_not_identical():
    times = {(r, i): (1.0, 1.0) for r in range(3) for i in range(2)}
    runs = _runs(times)
    plain, spec = runs[2][1]  # prompt b's speculative output differs in the last repeat only
    runs[2][1] = (plain, Generation(spec.tokens[:-1] + [99], spec.seconds, spec.accepted))
    s = summarize(rows_of(PAIR_PROMPTS, runs), k=3)
    assert s["identical"] == 1 and s["prompts"] == 2
    assert [r["identical"] for r in s["rows"]] == [True, False]
    assert s["rows"][1]["identical_repeats"] == [True, True, False]
    runs = _runs(times)
    plain, spec = runs[1][0]  # a plain output that changed between repeats is no reference
    runs[1][0] = (Generation([7] * len(plain.tokens), plain.seconds), spec)
    s = summarize(rows_of(PAIR_PROMPTS, runs), k=3)
    assert [r["identical"] for r in s["rows"]] == [False, True]


# ---------------------------------------------------------------------------------------------
# online SGLang client and lifecycle, against a fake server

FAKE = fake_server(
    setup="""
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
open(a.pid_file, "a").write(f"{child.pid}\\n")
time.sleep(0.5)  # not ready at once
print("fake server ready", a, flush=True)
""",
    post="""
n = req["sampling_params"]["max_new_tokens"]
out = [(sum(req["input_ids"]) + i) % 97 for i in range(n)]
meta = {"completion_tokens": n}
if a.speculative_algorithm:
    meta.update(spec_accept_length=2.5, spec_verify_ct=max(1, n // 2))
time.sleep(0.01 if a.speculative_algorithm else 0.02)
self._send(200, {"output_ids": out, "meta_info": meta})
""",
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.is_file() and stat.read_text().split()[2] == "Z")


def test_online_measures_both_servers_and_stops_them(tmp_path):
    script = tmp_path / "fake_sglang.py"
    script.write_text(FAKE)
    pids = tmp_path / "children.pid"
    prompts = [{"id": "a", "input_ids": [1, 2, 3]}, {"id": "b", "input_ids": [4, 5]}]
    rec = online.measure_servers(
        tmp_path / "target",
        tmp_path / "draft",
        prompts,
        max_new_tokens=6,
        draft_tokens=3,
        log_dir=tmp_path / "logs",
        launch_timeout=30,
        server_args=["--pid-file", str(pids)],
        launcher=[sys.executable, str(script)],
    )
    assert rec["status"] == "ok" and rec["prompts"] == 2
    assert rec["accept_length"] == pytest.approx(2.5)
    assert rec["identical"] == 2  # the fake answers the same ids with and without drafts
    assert rec["runs"]["plain"]["accept_length"] is None
    assert rec["speedup"] > 1.0  # the fake's EAGLE-3 answers faster
    log = (tmp_path / "logs" / "sglang-eagle3.log").read_text()
    assert "--speculative-algorithm EAGLE3" in log and "--speculative-num-draft-tokens 4" in log
    children = [int(x) for x in pids.read_text().split()]
    assert len(children) == 2
    deadline = time.time() + 10
    while any(_alive(c) for c in children) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(_alive(c) for c in children), "a server's child outlived it"


def test_online_serves_every_turn_and_each_setting_against_one_plain_run(tmp_path):
    from transformers import AutoTokenizer

    script = tmp_path / "fake_sglang.py"
    script.write_text(FAKE)
    tok = AutoTokenizer.from_pretrained(TOY)
    first = [{"role": "user", "content": "What is a list?"}]
    second = [{"role": "user", "content": "And a tuple?"}]
    ids = tok(tok.apply_chat_template(first, tokenize=False, add_generation_prompt=True),
              add_special_tokens=False)["input_ids"]  # fmt: skip
    prompts = [{"id": "q", "input_ids": ids, "messages": first, "follow_ups": [second]}]
    settings = [{"draft_tokens": 3}, {"draft_tokens": 7, "topk": 4, "verify_tokens": 16}]
    rec = online.measure_servers(tmp_path, tmp_path / "draft", prompts, max_new_tokens=5,
                                 draft_tokens=1, log_dir=tmp_path / "logs", launch_timeout=30,
                                 settings=settings,
                                 server_args=["--pid-file", str(tmp_path / "pids")],
                                 tokenizer=tok, launcher=[sys.executable, str(script)])  # fmt: skip
    assert [s["setting"] for s in rec["settings"]] == ["3-1-4", "7-4-16"]
    assert rec["setting"] == "3-1-4" and rec["turns"] == 2
    # the second question follows the server's own first answer, rendered independently here
    out1 = [(sum(ids) + i) % 97 for i in range(5)]
    history = [*first, {"role": "assistant", "content": tok.decode(out1, skip_special_tokens=True)
                        .strip()}, *second]  # fmt: skip
    ids2 = tok(tok.apply_chat_template(history, tokenize=False, add_generation_prompt=True),
               add_special_tokens=False)["input_ids"]  # fmt: skip
    row = rec["runs"]["plain"]["rows"][0]
    assert row["turns"] == [5, 5] and row["output_ids"] == out1 + [
        (sum(ids2) + i) % 97 for i in range(5)
    ]
    for s, flags in zip(rec["settings"], (("3", "1", "4"), ("7", "4", "16")), strict=True):
        assert s["identical"] == 1 and s["accept_length"] == pytest.approx(2.5)
        log = (tmp_path / "logs" / f"sglang-eagle3-{s['setting']}.log").read_text()
        steps, topk, verify = flags
        assert (
            f"--speculative-num-steps {steps}" in log
            and f"--speculative-eagle-topk {topk}" in log
            and f"--speculative-num-draft-tokens {verify}" in log
        )
    assert (tmp_path / "logs" / "sglang-plain.log").is_file()
    with pytest.raises(online.OnlineError, match="verify_tokens"):
        online.served_settings(3, settings=[{"draft_tokens": 3, "topk": 4}])


@pytest.mark.parametrize("ngram_starts", [True, False])
def test_ngram_is_served_after_the_drafter_without_it_and_a_failed_start_keeps_the_rest(
    tmp_path, ngram_starts
):
    from eyrie.evaluate.summary import Inputs, speed, summary_markdown

    refuse = "" if ngram_starts else "if a.speculative_algorithm == 'NGRAM': sys.exit(3)\n"
    script = tmp_path / "fake_sglang.py"
    script.write_text(FAKE.replace("child = subprocess", refuse + "child = subprocess", 1))
    prompts = [{"id": "a", "input_ids": [1, 2, 3]}]
    settings = [{"algorithm": "NGRAM", "draft_tokens": 7}, {"draft_tokens": 3}, {"draft_tokens": 7}]
    rec = online.measure_servers(tmp_path, tmp_path / "draft", prompts, max_new_tokens=6,
                                 draft_tokens=1, log_dir=tmp_path / "logs", launch_timeout=30,
                                 settings=settings,
                                 server_args=["--pid-file", str(tmp_path / "pids")],
                                 launcher=[sys.executable, str(script)])  # fmt: skip
    assert [s["setting"] for s in rec["settings"]] == ["3-1-4", "7-1-8", "7-1-8"]
    assert rec["setting"] == "3-1-4" and rec["algorithm"] == "EAGLE3"  # the headline
    # EAGLE-3's 7-1-8 and NGRAM's 7-1-8 each keep their served rows
    runs = {"3-1-4", "7-1-8"} | ({"NGRAM 7-1-8"} if ngram_starts else set())
    assert set(rec["setting_runs"]) == runs
    log = (tmp_path / "logs" / "sglang-ngram-7-1-8.log").read_text()
    assert "--speculative-algorithm NGRAM --speculative-num-draft-tokens 8" in log
    assert "--speculative-draft-model-path" not in log  # no drafter
    ngram = rec["settings"][2]
    if ngram_starts:
        assert ngram["accept_length"] == pytest.approx(2.5) and ngram["speedup"] > 1.0
        # a faster NGRAM still does not become the drafter's verdict
        ngram["speedup"] = 9.0
        assert speed(Inputs(online={"status": "ok", **rec}))[1].startswith("SGLang EAGLE-3")
    else:
        assert ngram["status"] == "failed" and "exited" in ngram["reason"].lower()
        assert rec["settings"][0]["speedup"] > 1.0
        text = summary_markdown(Inputs(online={"status": "ok", **rec}))
        assert "NGRAM lookup (no drafter)): not served: " in text


def test_online_measures_each_cuda_graph_mode_and_names_it(tmp_path):
    script = tmp_path / "fake_sglang.py"
    script.write_text(FAKE)
    prompts = [{"id": "a", "input_ids": [1, 2, 3]}]
    common = dict(max_new_tokens=4, draft_tokens=2, launch_timeout=30,
                  server_args=["--pid-file", str(tmp_path / "pids")],
                  launcher=[sys.executable, str(script)])  # fmt: skip
    rec = online.measure_servers(tmp_path, tmp_path, prompts, log_dir=tmp_path / "both",
                                 cuda_graph="both", **common)  # fmt: skip
    assert rec["mode"] == "cuda_graph" and list(rec["modes"]) == ["cuda_graph", "eager"]
    for mode, eager in (("cuda_graph", False), ("eager", True)):
        m = rec["modes"][mode]
        assert m["mode"] == mode and ("--disable-cuda-graph" in m["server_args"]) is eager
        for name in ("plain", "eagle3"):
            log = (tmp_path / "both" / mode / f"sglang-{name}.log").read_text()
            assert ("--disable-cuda-graph" in log) is eager, (mode, name)
        assert m["runs"]["plain"]["rows"][0]["input_ids"] == [1, 2, 3]
    assert "--disable-cuda-graph" not in online.DEFAULT_SERVER_ARGS
    assert "--disable-piecewise-cuda-graph" in online.DEFAULT_SERVER_ARGS
    eager = online.measure_servers(tmp_path, tmp_path, prompts, log_dir=tmp_path / "e",
                                   cuda_graph=False, **common)  # fmt: skip
    assert eager["mode"] == "eager" and list(eager["modes"]) == ["eager"]
    assert "--disable-cuda-graph" in (tmp_path / "e" / "sglang-plain.log").read_text()
    with pytest.raises(online.OnlineError, match="cuda_graph: false"):
        online.measure_servers(tmp_path, tmp_path, prompts, log_dir=tmp_path / "x",
                               **{**common, "server_args": ["--disable-cuda-graph"]})  # fmt: skip
    with pytest.raises(online.OnlineError, match="cuda_graph is 'yes'"):
        online.measure_servers(tmp_path, tmp_path, prompts, log_dir=tmp_path / "x",
                               cuda_graph="yes", **common)  # fmt: skip


def test_online_retries_a_port_taken_after_the_check(tmp_path, monkeypatch):
    import eyrie.sglang.server as ss

    script = tmp_path / "fake_sglang.py"
    script.write_text(FAKE)
    taken = socket.socket()
    taken.bind(("127.0.0.1", ss.free_port()))
    taken.listen()
    real, given = ss.free_port, []

    def next_port(*args, **kw):  # the first port handed out is taken by the time it is used
        given.append(real(*args, **kw) if given else taken.getsockname()[1])
        return given[-1]

    monkeypatch.setattr(ss, "free_port", next_port)
    monkeypatch.setattr(online, "free_port", next_port, raising=False)
    rec = online.measure_servers(tmp_path, tmp_path, [{"id": "a", "input_ids": [1, 2]}],
                                 max_new_tokens=3, draft_tokens=2, log_dir=tmp_path / "logs",
                                 launch_timeout=30,
                                 server_args=["--pid-file", str(tmp_path / "pids")],
                                 launcher=[sys.executable, str(script)])  # fmt: skip
    taken.close()
    assert rec["status"] == "ok" and len(given) == 3  # plain: taken, then another; EAGLE-3: one
    log = (tmp_path / "logs" / "sglang-plain.log").read_text()
    assert "Address already in use" in log and f"--port {given[1]}" in log.split("$ ")[-1]


def test_failing_server_reports_its_log(tmp_path):
    launcher = [sys.executable, "-c", "import sys; print('boom: no CUDA device'); sys.exit(3)"]
    with pytest.raises(online.OnlineError, match=r"(?s)exited with code 3.*boom: no CUDA device"):
        online.measure_servers(tmp_path, tmp_path, [{"id": "a", "input_ids": [1]}],
                               max_new_tokens=2, draft_tokens=2, log_dir=tmp_path,
                               launch_timeout=30, server_args=[],
                               launcher=launcher)  # fmt: skip


def test_server_never_ready_times_out_and_is_stopped(tmp_path):
    cmd = [sys.executable, "-c", "import time; print('loading', flush=True); time.sleep(120)"]
    server = online.Server(cmd, tmp_path / "s.log", online.free_port())
    with pytest.raises(online.OnlineError, match=r"(?s)not ready after 1 s.*loading"):
        with server:
            server.wait_healthy(timeout=1.0, poll=0.2)
    assert server.proc.poll() is not None


def test_not_run_reasons():
    assert "capture.backend is 'hf'" in online.why_not("hf")
    if not torch.cuda.is_available():
        assert "no CUDA GPU" in online.why_not("sglang")


def test_plain_greedy_records_the_top_two_logit_gap_of_each_new_token(tiny):
    target, _, _ = tiny
    prompt = PROMPTS[2]
    gen = greedy_generate(target, prompt, 6)
    ids = list(prompt)
    for i, token in enumerate(gen.tokens):  # a cacheless forward per token, independently
        with torch.no_grad():
            logits = target.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
        top = logits.topk(2).values
        assert gen.margins[i] == pytest.approx(float(top[0] - top[1]), abs=1e-4)
        ids.append(token)
    assert len(gen.margins) == len(gen.tokens) == 6
