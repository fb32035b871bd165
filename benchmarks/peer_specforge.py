"""A peer side by side: SpecForge's own EAGLE-3 trainer on this run's stores.

    python -m venv /tmp/sf-venv     # plus a .pth file naming Eyrie's site-packages and checkout
    /tmp/sf-venv/bin/pip install --no-deps specforge==0.2.0
    /tmp/sf-venv/bin/pip install triton datasets
    python benchmarks/peer_specforge.py convert --out /tmp/sf-data
    /tmp/sf-venv/bin/python benchmarks/peer_specforge.py train --data /tmp/sf-data [--lr 1e-4]
    python benchmarks/peer_specforge.py score --checkpoint /tmp/sf-data/out/lr0.0001/RUN-latest
    python benchmarks/peer_specforge.py drafter --checkpoint ... --out /tmp/sf-drafter

``convert`` writes SpecForge's offline feature files, one ``.ckpt`` per sample (its
``OfflineManifestReader`` reads a folder of them):
- input_ids and loss_mask (T,);
- hidden_state (1, T, H): the target's last state after its final norm, as the store's
  ``final_hidden`` is; SpecForge's TargetHead turns it into logits with the lm_head alone;
- aux_hidden_state (1, T, k * H): the store's aux states side by side, float32 for a CPU run
  (its drafter does not cast its inputs), ``--dtype bfloat16`` for a GPU run.
Train samples go to ``train/``, held-out ones to ``heldout/``. SpecForge reads its target's
lm_head and embedding through ``model.safetensors.index.json``, so ``target/`` is the target's
folder with its weights rewritten as one indexed file (a tied lm_head written out). The
drafter's shape is Eyrie's export's ``config.json`` (the same LlamaForCausalLMEagle3 keys).
SpecForge reads the ``.ckpt`` files with ``torch.load``: they are written here, never taken
from elsewhere.

``train`` runs ``specforge train`` (its CLI, offline runtime, optimizer, schedule and loss) in
one process on ``--device``, with the budget of Eyrie's run: the same epochs, batch size,
``max_len`` and unroll. The learning-rate recipe (cosine, warmup_ratio 0.015, max_grad_norm
0.5) is its own; ``--lr`` defaults to its 1e-4, and ``--lr`` at Eyrie's ``train.lr``
separates the recipe from the rest. On a CPU its Triton loss kernel cannot run:
``LogSoftmaxLoss`` becomes the plain-torch reference beside it in ``specforge/core/loss.py``
(``_compute_loss``), which computes the same value.

``drafter`` writes the checkpoint as an Eyrie drafter folder, so that ``eyrie export`` and
``eyrie speculate`` (the transformers loop, or SGLang) take it as they take Eyrie's own.

``score`` loads the run's checkpoint (``training_state.pt``, read with ``weights_only=True``)
into Eyrie's Drafter and runs Eyrie's offline acceptance on the held-out stores: both
drafters scored on the same rows by the same code.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from peers import save_as_drafter, stores
from peers import score as peer_score


def convert(args) -> None:
    from safetensors.torch import load_file, save_file

    from eyrie.store.shard import ShardReader

    out = Path(args.out)
    # its TargetHead is bf16 on every device; its drafter takes the aux states as they come
    dtype = getattr(torch, args.dtype)
    counts = {}
    for split in ("train", "heldout"):
        folder = out / split
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        i = 0
        for p in stores(Path(args.results), split):
            r = ShardReader(p)
            for j in range(len(r)):
                s = r[j]
                T = min(len(s["input_ids"]), args.max_len)
                aux = s["aux_hidden"][:T]  # (T, k, H)
                sample = {
                    "input_ids": s["input_ids"][:T].long().contiguous(),
                    "loss_mask": s["loss_mask"][:T].long().contiguous(),
                    "hidden_state": s["final_hidden"][:T][None].bfloat16().contiguous(),
                    "aux_hidden_state": aux.reshape(T, -1)[None].to(dtype).contiguous(),
                }
                torch.save(sample, folder / f"data_{i:08d}.ckpt")
                i += 1
        counts[split] = i
    target = Path(args.target)
    shim = out / "target"
    shutil.rmtree(shim, ignore_errors=True)
    shim.mkdir()
    for f in target.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors"):
            shutil.copy(f, shim / f.name)
    weights = {}
    for f in sorted(target.glob("*.safetensors")):
        weights.update(load_file(str(f)))
    if "lm_head.weight" not in weights:  # tied: the embedding is the head
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()
    save_file(weights, str(shim / "model.safetensors"))
    index = {"metadata": {}, "weight_map": {k: "model.safetensors" for k in weights}}
    (shim / "model.safetensors.index.json").write_text(json.dumps(index))
    export = Path(args.export or Path(args.results) / "export" / "sglang")
    draft = json.loads((export / "config.json").read_text())
    if draft.get("architectures") != ["LlamaForCausalLMEagle3"]:
        raise SystemExit(
            f"{export} is not an EAGLE-3 export; pass --export with Eyrie's EAGLE-3 one"
        )
    (out / "draft.json").write_text(json.dumps(draft, indent=2))
    print(json.dumps({"samples": counts, "target": str(shim), "draft": str(out / "draft.json")}))


def run_config(args) -> dict:
    data = Path(args.data).resolve()
    return {
        "model": {
            "target_model_path": str(data / "target"),
            "draft_model_config": str(data / "draft.json"),
            "torch_dtype": "float32" if args.device == "cpu" else "bfloat16",
        },
        "data": {
            "hidden_states_path": str(data / "train"),
            "eval_hidden_states_path": str(data / "heldout"),
            "max_length": args.max_len,
            "dataloader_num_workers": 0,
            "cache_dir": str(data / "cache"),  # its default is ./cache
        },
        "training": {
            "strategy": "eagle3",
            "num_epochs": args.epochs,
            "batch_size": args.batch_size,
            "learning_rate": args.lr,
            "ttt_length": args.ttt,
            "attention_backend": "sdpa",
            "fsdp_sharding": "NO_SHARD",
            "seed": args.seed,
            "eval_interval": args.eval_interval,
            "log_interval": args.log_interval,
        },
        "run_id": f"eyrie-peer-lr{args.lr:g}",
        "output_dir": str(data / "out" / f"lr{args.lr:g}"),
    }


def train(args) -> None:
    import os

    import yaml

    cfg = run_config(args)
    path = Path(args.data) / f"run-lr{args.lr:g}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    # its Triton loss kernel needs a GPU: on the CPU, the reference beside it in core/loss.py
    plain = (
        "import specforge.core.loss as L, specforge.algorithms.eagle3.model as M\n"
        "class Plain:\n"
        "    apply = staticmethod(lambda logits, p, mask: L._compute_loss(logits, p, mask))\n"
        "L.LogSoftmaxLoss = M.LogSoftmaxLoss = Plain\n"
    )
    # the peak of the device's memory, printed at exit (peer_specforge_throughput.py reads it)
    peak = (
        "import atexit, torch\n"
        "atexit.register(lambda: print('peak_memory_bytes', torch.cuda.max_memory_allocated(),"
        " flush=True))\n"
    )
    code = (
        (plain if args.device == "cpu" else peak)
        + "import sys\nfrom specforge.cli import main\n"
        + "sys.argv = ['specforge', 'train', '--config', sys.argv[1]]\n"
        + "sys.exit(main())\n"
    )
    env = {**os.environ, "SPECFORGE_DEVICE": args.device}
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, env=env)


def checkpoint(arg: str) -> tuple[dict, dict]:
    """(the drafter's state dict, where and at which step) of a run's step folder."""
    path = Path(arg)
    if path.is_dir():
        path = path / "training_state.pt"
    # a dict of tensors and numbers: loads without unpickling any object
    state = torch.load(path, map_location="cpu", weights_only=True)
    return state["draft_state_dict"], {"step": state["global_step"], "checkpoint": str(path)}


def score(args) -> None:
    """Eyrie's held-out acceptance of the run's last checkpoint (its ``-latest``)."""
    draft, where = checkpoint(args.checkpoint)
    res = peer_score(
        draft,
        target=args.target,
        results=args.results,
        steps=args.steps,
        max_len=args.max_len,
    )
    res["peer"] = where
    print(json.dumps(res))


def drafter(args) -> None:
    """The checkpoint as an Eyrie drafter folder, for ``eyrie export`` and ``eyrie speculate``."""
    draft, where = checkpoint(args.checkpoint)
    peer = {"tool": "specforge", "version": "0.2.0", **where}
    print(save_as_drafter(draft, args.target, args.template, args.out, peer))


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert")
    c.add_argument("--out", required=True)
    c.add_argument("--results", default="results")
    c.add_argument("--target", default="models/toy-llama-deep")
    c.add_argument("--dtype", default="float32", help="bfloat16 for a GPU run")
    c.add_argument("--export", help="Eyrie's SGLang export (the shape); {results}/export/sglang")
    t = sub.add_parser("train")
    t.add_argument("--data", required=True)
    t.add_argument("--lr", type=float, default=1e-4)
    t.add_argument("--epochs", type=int, default=5)
    t.add_argument("--batch-size", type=int, default=4)
    t.add_argument("--ttt", type=int, default=3)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    t.add_argument("--eval-interval", type=int, default=300, help="optimizer steps")
    t.add_argument("--log-interval", type=int, default=50, help="optimizer steps")
    s = sub.add_parser("score")
    s.add_argument("--checkpoint", required=True, help="a step folder or its training_state.pt")
    s.add_argument("--results", default="results")
    s.add_argument("--target", default="models/toy-llama-deep")
    s.add_argument("--steps", type=int, default=3)
    d = sub.add_parser("drafter")
    d.add_argument("--checkpoint", required=True, help="a step folder or its training_state.pt")
    d.add_argument("--template", default="results/train/drafter", help="Eyrie's, same stores")
    d.add_argument("--target", default="models/toy-llama-deep")
    d.add_argument("--out", required=True)
    for p in (c, t, s):
        p.add_argument("--max-len", type=int, default=512)
    args = ap.parse_args()
    torch.set_num_threads(2)
    {"convert": convert, "train": train, "score": score, "drafter": drafter}[args.cmd](args)


if __name__ == "__main__":
    main()
