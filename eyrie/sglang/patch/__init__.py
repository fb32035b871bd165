"""Capture from a live SGLang server without changing a file of it.

Two sides live here:
- the bundle generator (`bundle`), run by the patch_server rule from verify_env's report;
- the code that runs inside the server (`dump`, `hooks`, `finder`). The bundle copies these three
  files into its own `python/eyrie_sglang_patch/` package, so a server needs only torch and
  safetensors, not Eyrie. They import nothing from Eyrie and use relative imports only.

`standin` is a small transformers-backed server with SGLang's HTTP interface and batching
behaviour, for tests and CPU-only trials of the whole path.
"""

# Files of this package that run inside the server; the bundle copies exactly these.
SERVER_MODULES = ("dump.py", "hooks.py", "finder.py")
