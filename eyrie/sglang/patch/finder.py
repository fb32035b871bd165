"""The import hook: a `sys.meta_path` finder that patches SGLang's modules as they load.

For releases whose `--forward-hooks` cannot key states by request (0.5.9's ForwardBatch has no
`rids`) or that lack the option. The bundle's `sitecustomize.py` calls `install_from_env()` in
every Python process started with EYRIE_PATCH_MANIFEST set, so the patch is active in SGLang's
scheduler and worker processes too (each is a fresh interpreter that runs sitecustomize).
No file of SGLang changes: the finder wraps the loader of two modules and edits the loaded
module objects.

1. `sglang.srt.model_executor.forward_batch_info` (when the manifest says `add_rids`):
   `ForwardBatch.init_new` also copies each request's rid from the batch's `reqs`.
2. The module defining the target class: once an instance of exactly that class is built, it
   calls `set_eagle3_layers_to_capture(ids)` on the object the verify stage named (`call_on`:
   the top-level model for an `ok` verdict, the inner causal LM for `patchable`), checks that
   the layers' holder now captures layers [i + 1 for i in aux ids] (SGLang records the input of
   layer i + 1, which is the output of layer i), and wraps the holder's `forward`: it returns
   (final state, [aux states]) and each pass goes to the dumper.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

ENV_MANIFEST = "EYRIE_PATCH_MANIFEST"
ENV_DUMP_DIR = "EYRIE_PATCH_DUMP_DIR"
ENV_RID_PREFIX = "EYRIE_PATCH_RID_PREFIX"
FORWARD_BATCH_MODULE = "sglang.srt.model_executor.forward_batch_info"

# Written by the bundle as python/sitecustomize.py.
SITECUSTOMIZE = '''"""Eyrie's capture patch for SGLang, active where EYRIE_PATCH_MANIFEST is set."""

import os

if os.environ.get("EYRIE_PATCH_MANIFEST"):
    from eyrie_sglang_patch.finder import install_from_env

    install_from_env()

from eyrie_sglang_patch.finder import chain_sitecustomize

chain_sitecustomize(__file__)
'''


class _PatchingLoader(importlib.abc.Loader):
    """The module's own loader, followed by a patch of the executed module."""

    def __init__(self, loader, after: Callable):
        self._loader = loader
        self._after = after

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._after(module)

    def __getattr__(self, name):  # get_source, get_code, ... as the real loader has them
        return getattr(self._loader, name)


class PatchFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for the named modules it wraps the spec the next finders give."""

    def __init__(self, patches: dict[str, Callable]):
        self.patches = dict(patches)

    def find_spec(self, fullname, path, target=None):
        after = self.patches.get(fullname)
        if after is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _PatchingLoader(spec.loader, after)
        return spec


def resolve(obj, path: str):
    """obj.a.b for path "a.b" ("" is obj itself)."""
    for part in filter(None, path.split(".")):
        obj = getattr(obj, part)
    return obj


def add_rids(module) -> None:
    """ForwardBatch.init_new(batch, ...) also sets rids from batch.reqs when it does not."""
    fb_cls = module.ForwardBatch
    method = fb_cls.__dict__.get("init_new")
    func = getattr(method, "__func__", None)
    if func is None:
        raise ImportError(
            f"eyrie capture patch: {module.__name__}.ForwardBatch.init_new is not a classmethod "
            "in this release; rerun verify_env and patch_server on it"
        )

    @functools.wraps(func)
    def init_new(cls, batch, *args, **kwargs):
        ret = func(cls, batch, *args, **kwargs)
        reqs = getattr(batch, "reqs", None)
        if getattr(ret, "rids", None) is None and reqs is not None:
            try:
                ret.rids = [getattr(r, "rid", None) for r in reqs]
            except AttributeError:  # a slotted dataclass: the dumper reports the missing rids
                pass
        return ret

    fb_cls.init_new = classmethod(init_new)


class ModelPatch:
    """Enables SGLang's own aux capture on the verified object and feeds the dumper."""

    def __init__(self, manifest_path, dump_dir=None, rid_prefix=None):
        # torch-free until the model module loads: every process of the server runs this
        self.manifest_path, self.dump_dir, self.rid_prefix = manifest_path, dump_dir, rid_prefix
        with open(manifest_path) as f:
            self.manifest = json.load(f)
        if not (dump_dir or self.manifest.get("dump_dir")):
            raise ValueError(f"no dump folder: set {ENV_DUMP_DIR} (or dump_dir in the manifest)")
        self.spec = self.manifest["import_hook"]
        self.aux_ids = [int(i) for i in self.manifest["aux_layer_ids"]]
        self.pass_ids = [int(i) for i in self.manifest["pass_to_sglang"]]
        self.dumper = None

    def check_release(self) -> None:
        from .protocol import compare_files, sglang_package_dir

        package = sglang_package_dir()
        files = self.manifest["sglang"]["files"]
        bad = compare_files(package.parent, files) if package else ["sglang (not found)"]
        if bad:
            raise ImportError(
                "eyrie capture patch: the SGLang in this process differs from the one verified "
                f"({self.manifest['sglang']['version']}): {', '.join(bad)}. Rerun "
                "verify_env and patch_server on this installation"
            )

    def patch_module(self, module) -> None:
        self.check_release()
        name = self.spec["class"]
        cls = getattr(module, name, None)
        if not isinstance(cls, type):
            raise ImportError(
                f"eyrie capture patch: {module.__name__} defines no class {name}; the "
                "installed SGLang is not the one verified"
            )
        original = cls.__init__
        patch = self

        @functools.wraps(original)
        def __init__(model, *args, **kwargs):
            original(model, *args, **kwargs)
            if type(model) is cls:  # not a subclass such as a draft model
                patch.enable(model)

        cls.__init__ = __init__

    def enable(self, model) -> None:
        from .batch import find_batch, first_tensor
        from .dump import Dumper
        from .protocol import load_settings

        call_on, holder_path = self.spec["call_on"], self.spec["holder"]
        target = resolve(model, call_on)
        setter = getattr(target, "set_eagle3_layers_to_capture", None)
        where = f"model{'.' + call_on if call_on else ''}"
        if setter is None:
            raise AttributeError(
                f"eyrie capture patch: {where} ({type(target).__name__}) has no "
                "set_eagle3_layers_to_capture; the verify stage found one there"
            )
        setter(list(self.pass_ids))
        holder = resolve(model, holder_path)
        got = sorted(int(i) for i in (getattr(holder, "layers_to_capture", None) or []))
        want = sorted(i + 1 for i in self.aux_ids)
        if got != want:
            raise RuntimeError(
                f"eyrie capture patch: {where}.set_eagle3_layers_to_capture({self.pass_ids}) "
                f"made layers_to_capture {got}, not {want} (the outputs of layers "
                f"{self.aux_ids}); the release's shift rule is not the verified one"
            )
        settings = load_settings(
            self.manifest_path,
            dump_dir=self.dump_dir,
            rid_prefix=self.rid_prefix,
            mechanism="import_hook",
        )
        self.dumper = dumper = Dumper(settings)
        original = holder.forward

        @functools.wraps(original)
        def forward(*args, **kwargs):
            out = original(*args, **kwargs)
            try:
                batch = find_batch(args, kwargs)
                if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], list | tuple):
                    dumper.capture_pass(batch, list(out[1]), out[0])
                else:
                    dumper.capture_pass(batch, None, first_tensor(out))
            except Exception as exc:  # never take the server down: report it instead
                dumper.abort(exc)
            return out

        holder.forward = forward


def install(manifest_path, dump_dir=None, rid_prefix=None) -> PatchFinder:
    """Put the finder first on sys.meta_path (and patch modules already imported)."""
    patch = ModelPatch(manifest_path, dump_dir, rid_prefix)
    patches: dict[str, Callable] = {}
    if patch.spec.get("add_rids"):
        patches[FORWARD_BATCH_MODULE] = add_rids
    patches[patch.spec["module"]] = patch.patch_module
    finder = PatchFinder(patches)
    sys.meta_path.insert(0, finder)
    for name, fn in patches.items():
        if name in sys.modules:
            fn(sys.modules[name])
    return finder


def install_from_env() -> PatchFinder | None:
    """install() from EYRIE_PATCH_* variables; a failure is printed, not raised (sitecustomize)."""
    manifest = os.environ.get(ENV_MANIFEST)
    if not manifest:
        return None
    try:
        return install(manifest, os.environ.get(ENV_DUMP_DIR), os.environ.get(ENV_RID_PREFIX))
    except Exception as exc:
        message = f"eyrie capture patch: the import hook was not installed: {exc}"
        print(message, file=sys.stderr, flush=True)
        dump_dir = os.environ.get(ENV_DUMP_DIR)
        if dump_dir and os.path.isdir(dump_dir):
            path = Path(dump_dir) / f"status-{os.getpid()}.json"
            try:
                path.write_text(json.dumps({"pid": os.getpid(), "install_error": message}))
            except OSError:
                pass
        return None


def chain_sitecustomize(our_file: str) -> None:
    """Run the sitecustomize this one shadows on sys.path, if there is one."""
    ours = Path(our_file).resolve().parent
    for entry in sys.path:
        try:
            folder = Path(entry or ".").resolve()
        except OSError:
            continue
        candidate = folder / "sitecustomize.py"
        if folder == ours or not candidate.is_file():
            continue
        spec = importlib.util.spec_from_file_location("_eyrie_shadowed_sitecustomize", candidate)
        if spec and spec.loader:
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
        return
