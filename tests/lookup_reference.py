"""The context lookup by a plain backward scan: the reference the fast lookup is checked against."""


def scan_lookup(ctx: list[int], max_n: int = 4) -> int:
    """The token after the most recent earlier occurrence of ctx's longest suffix (max_n tokens
    down to 1); -1 when none occurred."""
    for n in range(min(max_n, len(ctx) - 1), 0, -1):
        for j in range(len(ctx) - n - 1, -1, -1):
            if ctx[j : j + n] == ctx[-n:]:
                return ctx[j + n]
    return -1
