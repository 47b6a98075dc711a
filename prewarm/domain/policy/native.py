"""Optional native build of the policy's modules (plan() and all it calls), compiled by mypyc.

Why: plan() runs every tick live and about 130 k times in a replayed day of the 1,350-model trace;
compiled, the same source decides the same and runs about 1.6× faster. The build is keyed by a hash
of the policy's sources (and the interpreter), so an edited source is never shadowed by a stale
build: a build is used only when it matches, otherwise the pure-Python modules run. `./test` and
`./run` build it when it is missing; without a C compiler or mypy the policy simply stays pure Python.

    python -m prewarm.domain.policy status   # which one runs, and where the build is
    python -m prewarm.domain.policy build    # compile now (if not built for these sources)

PREWARM_PURE_POLICY=1 forces the pure-Python modules; PREWARM_NATIVE_DIR moves the builds
(default: <sys.prefix>/prewarm-native, i.e. inside the virtualenv).
"""

from __future__ import annotations

import glob
import hashlib
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# compiled: plan() and every module it calls (one mypyc group, so the classes that cross modules,
# e.g. PlanCall extending Values, stay native), and types.py: its records (ReplicaState, ModelSpec,
# PolicyConfig...) are read in every loop of plan(), and as native classes a field is a struct read,
# not a dict lookup (a replayed day 11-16 % faster, the same decisions). Native, their fields' types are
# checked when one is made: a ReplicaState with bytes=1.5 is a TypeError, not a wrong sum later.
MODULES = ("planner", "memo", "timeline", "fleet", "value", "placement", "plan_call", "steps", "staging", "refresh",
           "words", "experts", "duels", "ahead", "firsts", "partners", "history", "silences", "arrivals", "types")
PACKAGE = "prewarm.domain.policy"
# Other domain modules the policy imports (dependency-free): type-checked with the build and hashed into it.
CORE = (HERE.parent / "states.py", HERE.parent / "action_kinds.py")

_active: Path | None = None  # the build in use, once activate() succeeded


def source_hash() -> str:
    h = hashlib.sha256(repr(MODULES).encode())  # what is compiled, too: a build without one of them never matches
    for name in MODULES:
        h.update(name.encode())
        h.update((HERE / f"{name}.py").read_bytes())
    for path in CORE:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return f"{h.hexdigest()[:16]}-{sys.implementation.cache_tag}"


def builds_root() -> Path:
    return Path(os.environ.get("PREWARM_NATIVE_DIR") or Path(sys.prefix) / "prewarm-native")


def build_dir() -> Path:
    """Where the build for the current sources lives (whether or not it exists)."""
    return builds_root() / source_hash()


def disabled() -> bool:
    return os.environ.get("PREWARM_PURE_POLICY", "") not in ("", "0", "false", "no")


def activate(package_path: list[str]) -> bool:
    """Called by the package's __init__ before it imports the hot modules: put a matching build
    first on the package's path. Any failure to import it leaves the pure-Python modules in place."""
    global _active
    if disabled():
        return False
    try:
        d = build_dir()
    except OSError:
        return False
    pkg, rt = d / "pkg", d / "rt"
    if not (d / "complete").is_file():
        return False
    package_path.insert(0, str(pkg))
    sys.path.append(str(rt))  # mypyc's shared runtime module for the group
    try:
        for name in MODULES:
            mod = importlib.import_module(f"{PACKAGE}.{name}")
            if not str(getattr(mod, "__file__", "")).startswith(str(pkg)):
                raise ImportError(f"{name} did not load from {pkg}")
    except Exception as exc:  # a broken or foreign build: run the sources instead
        package_path.remove(str(pkg))
        sys.path.remove(str(rt))
        for name in MODULES:
            sys.modules.pop(f"{PACKAGE}.{name}", None)
        print(f"prewarm: ignoring the native policy build in {d}: {exc}", file=sys.stderr)
        return False
    _active = d
    return True


def active() -> Path | None:
    """The build in use, or None when the policy runs as pure Python."""
    return _active


def build(force: bool = False) -> Path:
    """Compile the hot modules with mypyc into build_dir() (atomically: a half-done build is never used)."""
    dest = build_dir()
    if (dest / "complete").is_file() and not force:
        return dest
    root = builds_root()
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".build-") as tmp:
        src = Path(tmp) / "src"
        pkg_dir = src / "prewarm" / "domain" / "policy"
        pkg_dir.mkdir(parents=True)
        (src / "prewarm" / "__init__.py").write_text("")
        (src / "prewarm" / "domain" / "__init__.py").write_text("")
        for f in HERE.glob("*.py"):
            shutil.copy2(f, pkg_dir / f.name)
        for f in CORE:
            shutil.copy2(f, pkg_dir.parent / f.name)
        paths = [f"prewarm/domain/policy/{m}.py" for m in MODULES]
        proc = subprocess.run([sys.executable, "-m", "mypyc", *paths], cwd=src,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"mypyc failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        out = Path(tmp) / "out"
        (out / "pkg").mkdir(parents=True)
        (out / "rt").mkdir()
        for m in MODULES:
            [so] = glob.glob(str(pkg_dir / f"{m}.*.so"))
            shutil.move(so, out / "pkg" / Path(so).name)
        for so in glob.glob(str(src / "*__mypyc*.so")):
            shutil.move(so, out / "rt" / Path(so).name)
        (out / "complete").write_text(source_hash() + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        try:
            os.rename(out, dest)
        except OSError:
            if not (dest / "complete").is_file():  # another build won the race: theirs is as good
                raise
    for old in root.iterdir():  # builds of earlier sources are never used again
        if old.is_dir() and old != dest and not old.name.startswith(".build-"):
            shutil.rmtree(old, ignore_errors=True)
    return dest
