"""`python -m prewarm.domain.policy [status|build [--force]|ensure]`: the policy's native build (see native.py).
`ensure` builds when missing and never fails (no compiler: the policy stays pure Python)."""

from __future__ import annotations

import sys

from . import native


def main(argv: list[str]) -> int:
    cmd = argv[0] if argv else "status"
    if cmd == "status":
        where = native.active()
        print(f"policy: {'native (mypyc) from ' + str(where) if where else 'pure Python'}"
              f"{' (PREWARM_PURE_POLICY set)' if native.disabled() else ''}; "
              f"build for these sources: {native.build_dir()}")
        return 0
    if cmd in ("build", "ensure"):
        if cmd == "ensure" and (native.build_dir() / "complete").is_file():
            return 0  # built for these sources already
        try:
            d = native.build(force="--force" in argv)
        except Exception as exc:
            print(f"prewarm: no native policy build ({exc}); the policy runs as pure Python", file=sys.stderr)
            return 1 if cmd == "build" else 0
        print(f"prewarm: native policy build in {d}", file=sys.stderr)
        return 0
    print("usage: python -m prewarm.domain.policy [status|build [--force]|ensure]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
