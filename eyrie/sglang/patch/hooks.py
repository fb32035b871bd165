"""The factory SGLang's `--forward-hooks` option calls: torch forward hooks feeding the dumper.

SGLang calls `make_hook(config)` once per hook spec and registers the returned function on every
module the spec's `target_modules` match (sglang/srt/model_executor/hook_manager.py). The bundle
writes one spec per role, all sharing one dumper per process:

- `start` on decoder layer 0: a pass begins (its ForwardBatch is the layer's third positional
  input);
- `aux` (with `slot` j) on decoder layer `aux_layer_ids[j]`: the layer returns
  (hidden_states, residual, ...), whose sum is the layer's output;
- `final` on the final norm: the pass's final state; the pass's chunks are written.

Config keys: `manifest` (the bundle's manifest.json), `dump_dir`, `rid_prefix`, `role`, `slot`.
A hook never changes its module's output and never raises into SGLang's forward.
"""

from __future__ import annotations

import json
import sys

_DUMPERS: dict = {}  # (manifest, dump folder, rid prefix) -> dump.Dumper
ROLES = ("start", "aux", "final")
FACTORY = "eyrie_sglang_patch.hooks:make_hook"  # as the bundle ships this module


def hook_specs(manifest: dict, manifest_path: str, dump_dir: str, rid_prefix: str) -> list[dict]:
    """The --forward-hooks list: start, then each aux slot, then final (SGLang keeps the order)."""
    base = {"manifest": manifest_path, "dump_dir": dump_dir, "rid_prefix": rid_prefix}
    modules = manifest["hook_modules"]
    specs = [
        {
            "name": "eyrie-start",
            "target_modules": [modules["start"]],
            "hook_factory": FACTORY,
            "config": {**base, "role": "start"},
        }
    ]
    for slot, name in enumerate(modules["aux"]):
        specs.append(
            {
                "name": f"eyrie-aux-{slot}",
                "target_modules": [name],
                "hook_factory": FACTORY,
                "config": {**base, "role": "aux", "slot": slot},
            }
        )
    specs.append(
        {
            "name": "eyrie-final",
            "target_modules": [modules["final"]],
            "hook_factory": FACTORY,
            "config": {**base, "role": "final"},
        }
    )
    return specs


def shared_dumper(config: dict, mechanism: str):
    """One dumper per (manifest, dump folder, rid prefix) in this process."""
    from .dump import Dumper  # torch: not needed to print the specs
    from .protocol import load_settings

    key = (str(config["manifest"]), str(config.get("dump_dir")), str(config.get("rid_prefix")))
    if key not in _DUMPERS:
        settings = load_settings(
            config["manifest"],
            dump_dir=config.get("dump_dir"),
            rid_prefix=config.get("rid_prefix"),
            mechanism=mechanism,
        )
        _DUMPERS[key] = Dumper(settings)
    return _DUMPERS[key]


def _guarded(dumper, fn, *args) -> None:
    try:
        fn(*args)
    except Exception as exc:  # a bug here must not take the server down: report it instead
        dumper.abort(exc)


def make_hook(config: dict):
    """A forward hook for one role (see the module docstring)."""
    if not isinstance(config, dict) or "manifest" not in config:
        raise ValueError(f"eyrie capture hook: config must name the manifest, got {config!r}")
    role = config.get("role")
    if role not in ROLES:
        raise ValueError(f"eyrie capture hook: role {role!r} is not one of {ROLES}")
    from .batch import find_batch

    dumper = shared_dumper(config, "forward_hooks")

    if role == "start":

        def hook(module, args, output):
            _guarded(dumper, dumper.start, find_batch(args))

    elif role == "aux":
        slot = int(config["slot"])
        if not 0 <= slot < dumper.slots:
            raise ValueError(f"eyrie capture hook: slot {slot} is outside 0..{dumper.slots - 1}")

        def hook(module, args, output):
            _guarded(dumper, dumper.aux, slot, find_batch(args), output)

    else:

        def hook(module, args, output):
            _guarded(dumper, dumper.final, output)

    hook.__qualname__ = hook.__name__ = f"eyrie_capture_{role}"
    hook.dumper = dumper  # a host that stops the model flushes it (tests/e2e/standin.py)
    return hook


if __name__ == "__main__":  # launch.sh: print the --forward-hooks JSON
    _manifest_path, _dump_dir, _prefix = sys.argv[1:4]
    with open(_manifest_path) as _f:
        print(json.dumps(hook_specs(json.load(_f), _manifest_path, _dump_dir, _prefix)))
