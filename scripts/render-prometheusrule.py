#!/usr/bin/env python3
"""Writes deploy/prometheus/prometheusrule.yaml: deploy/prometheus/alerts.yml (the one home of the rules,
which promtool checks and tests) wrapped as the Prometheus operator's PrometheusRule, for deploy/k8s.

Kustomize cannot wrap a file into a resource's spec, hence this step. `--check` exits 1 when the committed
file is not what alerts.yml renders to (./test runs it: tests/system/test_deploy_manifests.py).

    python scripts/render-prometheusrule.py           # rewrite it after editing alerts.yml
    python scripts/render-prometheusrule.py --check
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "deploy" / "prometheus" / "alerts.yml"
TARGET = ROOT / "deploy" / "prometheus" / "prometheusrule.yaml"

HEAD = """\
# Generated from alerts.yml by scripts/render-prometheusrule.py: edit alerts.yml, then run that script.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: prewarm
  labels:
    app.kubernetes.io/name: prewarm
spec:
"""


def render(source: str) -> str:
    # The rules file's text, indented under spec (comments and block scalars kept as written).
    body = "".join(f"  {line}" if line.strip() else line for line in source.splitlines(keepends=True))
    return HEAD + body


def main(argv: list[str]) -> int:
    text = render(SOURCE.read_text())
    if argv[1:] == ["--check"]:
        if not TARGET.exists() or TARGET.read_text() != text:
            print(f"{TARGET.relative_to(ROOT)} is stale: run python scripts/render-prometheusrule.py",
                  file=sys.stderr)
            return 1
        return 0
    if argv[1:]:
        print(__doc__, file=sys.stderr)
        return 2
    TARGET.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
