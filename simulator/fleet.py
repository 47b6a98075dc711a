"""The simulated fleet's records (simulator.engine plays them): a replica on a GPU, a model's copy in a
node's host cache, the load link that replicas or copies share, a GPU and a node."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from prewarm.domain.baselines.shadow import Link
from prewarm.domain.states import LOADING, STAGING


@dataclass(eq=False, slots=True)
class Replica:
    model: int
    gpu: int
    bytes: int
    since: float  # load start
    state: str = LOADING  # PENDING (queued for a load slot), LOADING or READY (prewarm.domain.states)
    ready_at: float = math.nan
    last_request: float | None = None
    remaining: float = 0.0  # seconds of load work left at full speed
    kind: str = ""
    source: HostCopy | None = None  # the staged copy a promotion reads (None: read from storage)


@dataclass(eq=False, slots=True)
class HostCopy:
    """A model's bytes in a node's host cache: "staging" while read from storage, then "staged"."""

    model: int
    node: int
    bytes: int
    since: float  # stage start
    state: str = STAGING  # STAGING, then STAGED (prewarm.domain.states)
    ready_at: float = math.nan
    remaining: float = 0.0  # seconds of stage work left at full speed
    readers: int = 0  # promotions in flight reading this copy


@dataclass(slots=True)
class Gpu:
    index: int
    id: str
    node: str
    capacity: int
    used: int = 0
    residents: dict[int, Replica] = field(default_factory=dict)
    link: Link = field(default_factory=Link)  # its loads holding a load slot
    queue: deque[Replica] = field(default_factory=deque)  # loads waiting for a slot (FIFO)
    ni: int = 0  # index of its node in Simulation.nodes


@dataclass(slots=True)
class Node:
    index: int
    id: str
    capacity: int  # host cache budget (0: no staging tier)
    used: int = 0  # bytes of staging and staged copies
    cached: dict[int, HostCopy] = field(default_factory=dict)  # model -> copy
    link: Link = field(default_factory=Link)  # its stages in flight
