"""The layering of DESIGN.md, checked on the source: who may import whom (issue 15)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("prewarm", "gpu_worker", "scheduler", "web", "simulator", "bench")
# Imports run one way: domain <- core (store, services, config) <- apps (scheduler, gpu_worker, web) and the
# tools (simulator, bench). importer (module prefix) -> module prefixes it must never import.
APPS = ("gpu_worker", "scheduler", "web")
NEVER = {
    "prewarm": (*APPS, "simulator", "bench", "prewarm.programs"),
    "scheduler": ("web", "gpu_worker", "simulator", "prewarm.programs"),
    "web": ("gpu_worker", "scheduler", "simulator", "torch", "prewarm.programs"),
    "gpu_worker": ("web", "scheduler", "simulator", "prewarm.programs"),
    "simulator": (*APPS, "prewarm.programs"),
    "bench": ("tests",),
}
# The domain is pure: it imports itself, the standard library and numpy, and nothing else of ours or of I/O.
DOMAIN = "prewarm.domain"
DOMAIN_MAY = (DOMAIN, "numpy", "__future__")
OURS = ("prewarm", *PARTS)
IO = ("redis", "celery", "kombu", "torch", "flask", "safetensors", "psutil", "requests", "socket", "os",
      "subprocess", "time")
# The native build's loader and its command line compile and find the build: they are the domain's only I/O.
DOMAIN_IO_OK = ("prewarm.domain.policy.native", "prewarm.domain.policy.__main__")
# The routers' own libraries: in prewarm/ only their integration imports them (the core never needs them;
# the tools, e.g. `prewarm bench router`, may). An
# integration runs in the router's process, which has none of prewarm's dependencies: it imports the client
# (standard library) and the state names, nothing else of ours.
ROUTERS = ("litellm",)
INTEGRATIONS = "prewarm.integrations"
INTEGRATIONS_MAY = ("prewarm.client", "prewarm.domain.states", INTEGRATIONS)


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _violations(mod: str, names: set[str]) -> list[str]:
    if _under(mod, "prewarm.programs"):
        return []  # the programs may use everything
    bad = [f"{mod} imports {name}" for imp, banned in NEVER.items() if _under(mod, imp)
           for name in sorted(names) if any(_under(name, b) for b in banned)]
    if _under(mod, DOMAIN):
        io = () if mod in DOMAIN_IO_OK else IO
        bad += [f"{mod} imports {name}" for name in sorted(names)
                if not any(_under(name, a) for a in DOMAIN_MAY)
                and any(_under(name, b) for b in (*OURS, *io))]
    if _under(mod, INTEGRATIONS):
        bad += [f"{mod} imports {name}" for name in sorted(names) if _under(name, "prewarm")
                and name not in ("prewarm", "prewarm.domain") and not any(_under(name, a) for a in INTEGRATIONS_MAY)]
    elif _under(mod, "prewarm"):
        bad += [f"{mod} imports {name}" for name in sorted(names) if any(_under(name, x) for x in ROUTERS)]
    return sorted(set(bad))


def test_no_module_imports_against_the_layers() -> None:
    bad = [v for part in PARTS for path in sorted((ROOT / part).rglob("*.py"))
           for v in _violations(_module(path), _imports(path))]
    assert not bad, "\n".join(bad)


def test_the_rules_catch_what_the_design_forbids(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text("from web.metrics import memory_split\nimport prewarm.programs.cli\n")
    names = _imports(src)
    assert _violations("scheduler.live", names) == ["scheduler.live imports prewarm.programs.cli",
                                                     "scheduler.live imports web.metrics",
                                                     "scheduler.live imports web.metrics.memory_split"]
    assert _violations("prewarm.state", {"prewarm.programs.ops"}) == ["prewarm.state imports prewarm.programs.ops"]
    assert _violations("prewarm.domain.policy.plan_call", {"redis"}) == ["prewarm.domain.policy.plan_call imports redis"]
    assert _violations("prewarm.domain.slo", {"prewarm.config"}) == ["prewarm.domain.slo imports prewarm.config"]
    assert _violations("prewarm.domain.choice", {"prewarm.domain.policy.planner", "numpy"}) == []
    assert _violations("prewarm.rooms", {"prewarm.domain.policy.placement"}) == []  # the domain is below
    assert _violations("prewarm.programs.up", names) == []
    assert _violations("prewarm.services.routing", {"litellm.router"}) == [
        "prewarm.services.routing imports litellm.router"]
    assert _violations("prewarm.integrations.litellm.routing", {"litellm", "prewarm.client", "prewarm.domain",
                                                                 "prewarm.domain.states"}) == []
    assert _violations("prewarm.integrations.litellm.routing", {"prewarm.config"}) == [
        "prewarm.integrations.litellm.routing imports prewarm.config"]


def test_the_bundled_trace_is_where_the_traffic_player_looks() -> None:
    # The player moved into prewarm/programs/; the trace is package data of prewarm/ (found by ./run).
    from prewarm.programs.replay import BUNDLED_TRACE

    assert BUNDLED_TRACE.is_file(), BUNDLED_TRACE
