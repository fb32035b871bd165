"""A peer side by side: vLLM speculators' own EAGLE-3 trainer on this run's stores.

    python -m venv --system-site-packages /tmp/peer-venv
    /tmp/peer-venv/bin/pip install --no-deps speculators==0.9.0
    /tmp/peer-venv/bin/pip install datasets==5.1.0 openai loguru hs-connectors==0.9.0
    /tmp/peer-venv/bin/python benchmarks/peer_speculators.py convert --out /tmp/peer-data
    /tmp/peer-venv/bin/python benchmarks/peer_speculators.py train --data-path /tmp/peer-data ...
    python benchmarks/peer_speculators.py score --checkpoint CKPT   (Eyrie's held-out metric)
    python benchmarks/peer_speculators.py drafter --checkpoint CKPT --out DIR   (for eyrie export)

``convert`` writes speculators' offline format: a datasets folder (input_ids, loss_mask,
seq_len; train samples first, then held-out ones) and hidden_states/hs_{i}.safetensors with
hidden_states (T, k + 1, H) = the k aux states and the verifier's last state, token_ids (T).
speculators applies the verifier's final norm itself, while the store keeps the normed state
y = w * x / rms(x); it is handed y / w, whose RMS is 1, so that norm(y / w) = y again.
Its train/val split is by position; the ratio printed makes val exactly the held-out stores.

``score`` loads the trained speculators checkpoint (layers.0.*, fc, norm, lm_head; full
vocabulary) into Eyrie's Drafter and runs Eyrie's offline acceptance on the held-out stores,
so both drafters are scored on the same rows by the same code.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from peers import stores


def convert(args) -> None:
    from datasets import Dataset
    from safetensors.torch import load_file, save_file

    from eyrie.store.shard import ShardReader

    norm_w = load_file(str(Path(args.target) / "model.safetensors"))["model.norm.weight"].float()
    out = Path(args.out)
    (out / "hidden_states").mkdir(parents=True, exist_ok=True)
    rows = {"input_ids": [], "loss_mask": [], "seq_len": []}
    i, n_train = 0, 0
    for split in ("train", "heldout"):
        for p in stores(Path(args.results), split):
            r = ShardReader(p)
            for j in range(len(r)):
                s = r[j]
                T = min(len(s["input_ids"]), args.max_len)
                last = (s["final_hidden"][:T].float() / norm_w).bfloat16()
                hs = torch.cat([s["aux_hidden"][:T], last[:, None]], dim=1)
                ids = s["input_ids"][:T]
                save_file(
                    {"hidden_states": hs.contiguous(), "token_ids": ids.contiguous()},
                    str(out / "hidden_states" / f"hs_{i}.safetensors"),
                )
                rows["input_ids"].append(ids.tolist())
                rows["loss_mask"].append(s["loss_mask"][:T].long().tolist())
                rows["seq_len"].append(T)
                i += 1
                n_train += split == "train"
    Dataset.from_dict(rows).with_format("torch").save_to_disk(str(out))
    ratio = (n_train + 0.5) / i
    print(json.dumps({"samples": i, "train": n_train, "train_data_ratio": ratio}))


def train(argv: list[str]) -> None:
    """speculators' own trainer, with its two accelerator assumptions bent to the CPU.

    Its Trainer puts the model and every batch on ``get_local_rank()``, an int that torch
    reads as a CUDA device index, and its step timer calls ``torch.accelerator.synchronize()``;
    on a CPU machine both raise "RuntimeError: Cannot access accelerator device when none is
    available". Here the device is the CPU and the synchronize a no-op. Nothing else changes.
    """
    import sys

    import speculators.train.trainer as trainer
    from speculators.train.cli import main as train_main
    from speculators.train.config import TrainConfig

    trainer.get_local_rank = lambda: torch.device("cpu")
    torch.accelerator.synchronize = lambda *a, **k: None
    sys.argv = ["speculators.train", *argv]
    train_main(TrainConfig.resolve())


def checkpoint(folder: str) -> dict:
    """The trained checkpoint's tensors under Eyrie's Drafter names."""
    from safetensors.torch import load_file

    sd = load_file(str(Path(folder) / "model.safetensors"))
    return {k.replace("layers.0.", "midlayer."): v for k, v in sd.items()}


def score(args) -> None:
    from peers import score as peer_score

    res = peer_score(
        checkpoint(args.checkpoint),
        target=args.target,
        results=args.results,
        steps=args.steps,
        max_len=args.max_len,
    )
    print(json.dumps(res))


def drafter(args) -> None:
    """The checkpoint as an Eyrie drafter folder, for ``eyrie export`` and ``eyrie speculate``."""
    from peers import save_as_drafter

    step = json.loads((Path(args.checkpoint) / "training_state.json").read_text())["global_step"]
    peer = {"tool": "speculators", "version": "0.9.0", "checkpoint": args.checkpoint, "step": step}
    print(save_as_drafter(checkpoint(args.checkpoint), args.target, args.template, args.out, peer))


def main() -> None:
    import sys

    if sys.argv[1:2] == ["train"]:
        torch.set_num_threads(2)
        return train(sys.argv[2:])
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert")
    c.add_argument("--out", required=True)
    s = sub.add_parser("score")
    s.add_argument("--checkpoint", required=True)
    s.add_argument("--steps", type=int, default=3)
    d = sub.add_parser("drafter")
    d.add_argument("--checkpoint", required=True)
    d.add_argument("--template", default="results/train/drafter", help="Eyrie's, same stores")
    d.add_argument("--out", required=True)
    for p in (c, s, d):
        p.add_argument("--results", default="results")
        p.add_argument("--target", default="models/toy-llama-deep")
        p.add_argument("--max-len", type=int, default=512)
    args = ap.parse_args()
    torch.set_num_threads(1)
    {"convert": convert, "score": score, "drafter": drafter}[args.cmd](args)


if __name__ == "__main__":
    main()
