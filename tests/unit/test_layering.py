"""The layering of DESIGN.md, checked on the source: who may import whom (issue 15)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("prewarm", "gpu_worker", "scheduler", "web", "simulator", "bench")
# importer (module prefix) -> module prefixes it must never import
NEVER = {
    "scheduler": ("web", "gpu_worker", "simulator", "prewarm.programs"),
    "scheduler.policy": ("redis", "celery", "torch", "flask", "prewarm.store", "prewarm.state"),
    "web": ("gpu_worker", "scheduler.live", "simulator", "torch", "prewarm.programs"),
    "gpu_worker": ("web", "scheduler", "simulator", "prewarm.programs"),
    "prewarm": ("gpu_worker", "scheduler", "web", "simulator", "bench", "prewarm.programs"),
    "simulator": ("web", "gpu_worker", "prewarm.programs"),
    "bench": ("tests",),
}
# The pure policy package sits below the core (DESIGN.md's layer diagram): the core may use it (the one
# placement rule), never the live scheduler around it.
ALLOW = {"prewarm": ("scheduler.policy",)}


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
    bad = []
    for imp, banned in NEVER.items():
        if not _under(mod, imp):
            continue
        for name in sorted(names):
            if any(_under(name, a) for a in ALLOW.get(imp, ())):
                continue
            bad += [f"{mod} imports {name}" for b in banned if _under(name, b)]
    return bad


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
    assert _violations("scheduler.policy.tick", {"redis"}) == ["scheduler.policy.tick imports redis"]
    assert _violations("prewarm.rooms", {"scheduler.policy.placement"}) == []  # the pure layer is below
    assert _violations("prewarm.programs.up", names) == []


def test_the_bundled_trace_is_where_the_traffic_player_looks() -> None:
    # The player moved into prewarm/programs/; the trace is package data of prewarm/ (found by ./run).
    from prewarm.programs.replay import BUNDLED_TRACE

    assert BUNDLED_TRACE.is_file(), BUNDLED_TRACE
