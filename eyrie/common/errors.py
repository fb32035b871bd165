"""The one base class of Eyrie's own errors.

Every stage raises a subclass of EyrieError for a bad input, a broken store or a refused setting,
with a message that names the input and the fix. The command line and the Snakemake script
adapters catch EyrieError once and print that message without a traceback; anything else is a
bug and keeps its traceback. Subclasses also keep their built-in base (ValueError for bad input,
RuntimeError for a failed step), so callers that catch those still do.
"""


class EyrieError(Exception):
    """An error whose message tells the user what is wrong and what to do about it."""


def known_errors() -> tuple[type[Exception], ...]:
    """The failures with a plain message (shown as is); anything else is a bug to trace."""
    return (EyrieError, FileNotFoundError)


class ExtractError(EyrieError, RuntimeError):
    """Extraction cannot start or go on; the message names the input and the fix.

    Here, not in eyrie.extract, because the split reading that validation shares raises it too
    (eyrie.data.split)."""


class DrafterError(EyrieError, ValueError):
    """A drafter or target setup that cannot work; the message names the input and the fix.

    Here, not in eyrie.train, because reading the target's tensors (eyrie.target.tensors) raises
    it too."""
