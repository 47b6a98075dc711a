"""The do-nothing base of every simulated policy: one hook per engine event (`engine.Policy`)."""

from __future__ import annotations

from .engine import HostCopy, Replica, Simulation


class _Base:
    name = "base"
    tick_s: float | None = None

    def attach(self, sim: Simulation) -> None:
        self.sim = sim

    def on_request(self, t: float, m: int, warm: bool) -> None:
        pass

    def on_miss(self, t: float, m: int) -> None:
        pass

    def on_stalled(self, t: float, models: list[int]) -> None:
        for m in models:
            if m in self.sim.stalled and not self.sim.replicas[m]:
                self.on_miss(t, m)

    def on_ready(self, t: float, r: Replica) -> None:
        pass

    def on_load_start(self, t: float, r: Replica) -> None:
        pass  # a queued ("pending") load got a load slot

    def on_staged(self, t: float, c: HostCopy) -> None:
        pass

    def on_tick(self, t: float) -> None:
        pass

    def on_timer(self, t: float, payload: tuple) -> None:
        pass
