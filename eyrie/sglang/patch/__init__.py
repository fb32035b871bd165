"""Capture from a live SGLang server without changing a file of it.

Two sides live here:
- the bundle generator (`settings`, `manifest`, `bundle`), run by the patch_server rule from
  verify_env's report;
- the code that runs inside the server (`protocol`, `batch`, `handoff`, `dump`, `hooks`,
  `finder`). The bundle copies these files (SERVER_MODULES) into its own
  `python/eyrie_sglang_patch/` package, so a server needs only torch, not Eyrie. They import
  nothing from Eyrie and use relative imports only.
"""

# Files of this package that run inside the server; the bundle copies exactly these.
SERVER_MODULES = ("protocol.py", "batch.py", "handoff.py", "dump.py", "hooks.py", "finder.py")
