"""benchmarks/sglang_capture_overhead.py's timed pass against the fake SGLang server.

The fake counts what it received (requests, prompt tokens, the most in flight at once) and takes
20 ms a request; the pass must report the same counts, keep --concurrency requests in flight
(no more), and refuse an answer whose prompt length is not what was sent.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from fake_sglang import fake_server

from eyrie.evaluate.online import OnlineError
from eyrie.sglang.http import post_json
from eyrie.sglang.server import ready_server

ROOT = Path(__file__).resolve().parents[1]
FAKE = fake_server(
    setup="""
import threading
LOCK = threading.Lock()
SEEN = {"requests": 0, "tokens": 0, "in_flight": 0, "most_in_flight": 0}
""",
    post="""
if self.path == "/seen":
    self._send(200, SEEN)
else:
    n = len(req["input_ids"])
    with LOCK:
        SEEN["requests"] += 1
        SEEN["tokens"] += n
        SEEN["in_flight"] += 1
        SEEN["most_in_flight"] = max(SEEN["most_in_flight"], SEEN["in_flight"])
    time.sleep(0.02)
    with LOCK:
        SEEN["in_flight"] -= 1
    told = n + 1 if req["rid"].startswith("lie-") else n
    self._send(200, {"output_ids": [7], "meta_info": {"prompt_tokens": told}})
""",
)


def load_benchmark():
    path = ROOT / "benchmarks" / "sglang_capture_overhead.py"
    spec = importlib.util.spec_from_file_location("sglang_capture_overhead", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_pass_counts_what_the_server_received(tmp_path):
    bench = load_benchmark()
    (tmp_path / "fake.py").write_text(FAKE)
    samples = [(f"s{i}", list(range(3 + i % 5))) for i in range(24)]

    def command(port: int) -> list[str]:
        return [sys.executable, str(tmp_path / "fake.py"), "--port", str(port)]

    with ready_server(command, tmp_path / "fake.log", 60) as server:
        send = bench.plain_sender(server.url)
        rec = bench.timed_pass(send, samples, 4, "t-")
        _, seen = post_json(f"{server.url}/seen", {}, 10)
        with pytest.raises(OnlineError, match="sent 3 tokens"):
            bench.timed_pass(send, samples[:1], 1, "lie-")
    assert rec["requests"] == seen["requests"] == 24
    assert rec["prompt_tokens"] == seen["tokens"] == sum(len(ids) for _, ids in samples)
    assert seen["most_in_flight"] == 4, json.dumps(seen)
    assert 24 * 0.02 / 4 <= rec["seconds"] < 24 * 0.02  # in flight together, not one by one
    assert rec["tokens_per_s"] == pytest.approx(rec["prompt_tokens"] / rec["seconds"])
    assert rec["state_bytes"] == 0


def test_paired_servers_get_their_own_memory_share():
    bench = load_benchmark()
    settings = {"server_args": ["--a", "--mem-fraction-static", "0.5", "--b", "1",
                                "--mem-fraction-static=0.7"], "dtype": "bfloat16"}  # fmt: skip
    got = bench.with_memory(settings, 0.3)
    assert got["server_args"] == ["--a", "--b", "1", "--mem-fraction-static", "0.3"]
    assert settings["server_args"][2] == "0.5"  # the caller's settings are left as they were
