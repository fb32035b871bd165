"""benchmarks/stage_costs.py: each stage's cost read back from a run's own records."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "stage_costs", ROOT / "benchmarks" / "stage_costs.py"
)
sc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sc)

HEAD = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"


def bench(path: Path, seconds: float, rss: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEAD + f"{seconds}\t0:00:01\t{rss}\t1\t1\t1\t0\t0\t0\t1\n")


def test_costs_sum_a_rules_jobs_and_divide_by_its_tokens(tmp_path):
    r = tmp_path / "results"
    bench(r / "benchmarks/extract/train/shard-000.tsv", 30.0, 900)
    bench(r / "benchmarks/extract/train/shard-001.tsv", 10.0, 1200)
    bench(r / "benchmarks/extract/heldout/shard-000.tsv", 10.0, 800)
    bench(r / "benchmarks/validate/train/shard-000.tsv", 5.0, 100)
    bench(r / "benchmarks/validate/summary.tsv", 1.0, 50)
    bench(r / "benchmarks/evaluate/speculate.tsv", 7.0, 60)
    bench(r / "benchmarks/train_drafter.tsv", 20.0, 2000)
    (r / "validate").mkdir()
    (r / "validate/summary.csv").write_text(
        "split,shard,tokens\ntrain,000,600\ntrain,001,300\nheldout,000,100\nall,all,1000\n"
    )
    (r / "train").mkdir()
    (r / "train/metrics.csv").write_text("step,tokens\n1,1500\n2,1500\n")
    (r / "store").mkdir()
    (r / "store/x.bin").write_bytes(b"0" * 2_000_000)
    rows = {row["stage"]: row for row in sc.stage_costs(r)["stages"]}
    ext = rows["extract"]
    assert (ext["jobs"], ext["seconds"], ext["max_rss_mb"], ext["tokens"]) == (3, 50.0, 1200, 1000)
    assert ext["tokens_per_s"] == 20.0 and ext["disk_bytes"] == 2_000_000
    assert rows["validate_shard"]["jobs"] == 1 and rows["validate_summary"]["jobs"] == 1
    assert rows["train_drafter"]["tokens_per_s"] == 150.0  # 3,000 tokens trained in 20 s
    assert "evaluate_speculate" in rows and rows["evaluate_speculate"]["tokens"] is None
    assert "| extract | 3 | 50.0 | 1,000 | 20 | 1200 | 2.0 |" in sc.table(sc.stage_costs(r))


def test_compare_gives_seconds_per_million_tokens_and_flags_growth():
    def run(tokens, extract_s, train_s):
        rows = [("extract", extract_s), ("train_drafter", train_s)]
        return {"stages": [{"stage": n, "seconds": s, "tokens": tokens} for n, s in rows]}

    out = sc.compare([run(2_000_000, 40.0, 100.0), run(1_000_000, 20.0, 40.0)])
    assert "| 1,000,000 tokens | 2,000,000 tokens |" in out  # smallest first
    assert "| extract | 20.0 | 20.0 | 1.00 | 0.0 | 20.0 | flat |" in out  # s per M tokens
    # 40 s, then 100 s: 60 s per M at the margin, a fixed cost of -20 s: it grows
    assert "| train_drafter | 40.0 | 50.0 | 1.25 | -20.0 | 60.0 | **grows** |" in out


def test_compare_tells_a_fixed_cost_from_a_cost_that_grows_at_the_margin():
    def run(tokens, seconds):
        costs = {"extract": tokens / 1e6, "validate": seconds(tokens)}
        return {"stages": [{"stage": n, "seconds": s, "tokens": tokens} for n, s in costs.items()]}

    fixed = [run(n, lambda t: 30 + 10 * t / 1e6) for n in (1_000_000, 2_000_000, 4_000_000)]
    out = sc.compare(fixed)  # per M tokens 40, 25, 17.5: a fixed 30 s plus 10 s per M
    assert "| validate | 40.0 | 25.0 | 17.5 | 0.44 | 30.0 | 10.0 | falls: fixed cost |" in out
    # 100 s plus the square of the size: per M tokens it falls (101, 52, 29), but the margin
    # doubles from one pair of sizes to the next, and a fixed cost must not hide that
    square = [run(n, lambda t: 100 + (t / 1e6) ** 2) for n in (1_000_000, 2_000_000, 4_000_000)]
    assert "**grows at the margin** (2.00×)" in sc.compare(square)
    assert sc.margins([(1, 1.0), (3, 5.0)]) == (-1.0, 2e6, None)  # under three points: no growth
    # the rehearsal's draft_vocab on the CPU: 1.38, 1.43 and 1.81 s at 53 K, 104 K and 202 K
    # tokens; its margin "grows" 3.9x, but by 0.28 s over the last pair: a job's jitter
    jitter = [(53_298, 1.38), (103_527, 1.43), (202_175, 1.81)]
    assert sc.margins(jitter)[2] is None
    assert sc.margins(jitter, noise_s=0.1)[2] > 3.8


def test_rehearsal_conversations_reach_the_tokens_within_the_sample_limit(tmp_path):
    import json

    from transformers import AutoTokenizer

    spec = importlib.util.spec_from_file_location("ri", ROOT / "benchmarks" / "rehearsal_inputs.py")
    ri = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ri)
    toy = ROOT / "models" / "toy-llama"
    rec = ri.conversations(toy, 9000, 600, tmp_path / "c.jsonl")
    tok = AutoTokenizer.from_pretrained(toy)
    rows = [json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    sizes = [len(tok(tok.apply_chat_template(r["messages"], tokenize=False),
                     add_special_tokens=False)["input_ids"]) for r in rows]  # fmt: skip
    assert rec["samples"] == len(rows) == len({r["id"] for r in rows})
    assert max(sizes) <= 600 and sum(sizes) == rec["tokens"] >= 9000
