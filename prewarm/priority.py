"""Load priorities: the one place their names and order are spelled.

A catalog entry's `priority` (and a route lookup's `priority` parameter) is one of LEVELS. The worker
orders the loads waiting for a GPU's load slots by it (high first, FIFO within a level), and the policy
never evicts a replica of a higher-priority model to make room for a lower-priority speculative load.
Dependency-free: the catalog, the web, the worker and the pure policy (as the int `rank`) all use it.
"""

from __future__ import annotations

LEVELS: tuple[str, ...] = ("low", "normal", "high")  # lowest first: a level's rank is its index
DEFAULT = "normal"


def rank(level: str | None) -> int:
    """0 low, 1 normal, 2 high; None (a message or record from before priorities) is normal."""
    return LEVELS.index(DEFAULT if level is None else level)


def check(level: object, where: str) -> str:
    """`level` if it names a priority, else ValueError naming `where` and the allowed values."""
    if not isinstance(level, str) or level not in LEVELS:
        raise ValueError(f"{where}: priority {level!r} is not one of {', '.join(LEVELS)}")
    return level
