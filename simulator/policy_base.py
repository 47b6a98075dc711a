"""The base of the simulator's own policies (the oracle, prewarm's adapter): a baselines `Rule` that also
keeps the engine as `sim`, for what only the simulator has (the trace, stages, load starts)."""

from __future__ import annotations

from prewarm.domain.baselines import Rule

from .engine import Simulation


class _Base(Rule):
    def attach(self, sim: Simulation) -> None:  # type: ignore[override]
        super().attach(sim)
        self.sim = sim
