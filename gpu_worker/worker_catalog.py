"""NodeWorker's catalog (mixed into gpu_worker.residency.NodeWorker): reloaded when its file changes,
loaded leniently so one bad entry is refused by name and the others are served.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from gpu_worker.errors import (
    CatalogRefused,
    UnknownModel,
)
from prewarm.catalog import load_catalog
from prewarm.catalog_entries import Catalog, CatalogError, ModelEntry

log = logging.getLogger("prewarm.worker")


class CatalogReload:
    """The catalog a worker serves; needs catalog_path, _catalog, _catalog_mtime, _catalog_error and
    _catalog_lock (set by NodeWorker.__init__)."""

    catalog_path: Path
    _catalog: Catalog | None
    _catalog_mtime: float
    _catalog_error: str | None
    _catalog_lock: threading.Lock

    def catalog(self) -> Catalog:
        """The catalog, reloaded when its file changes. Loaded leniently (issue 17): a bad entry (weights
        outside the model roots, a builder that does not import, a broken file) is refused by name —
        logged, published with the heartbeat (catalog_problems) — and every other entry is served. A file
        that cannot be read as a catalog at all keeps the last good one."""
        with self._catalog_lock:
            try:
                mtime = self.catalog_path.stat().st_mtime
            except FileNotFoundError:
                mtime = -2.0
            if mtime != self._catalog_mtime:
                self._catalog_mtime = mtime
                try:
                    cat = load_catalog(self.catalog_path, strict=False)
                except CatalogError as exc:
                    self._catalog_error = str(exc)
                    log.error("catalog %s: %s", self.catalog_path, exc)
                except Exception as exc:  # noqa: BLE001 - a bug: still reported, and the last good one kept
                    self._catalog_error = f"unexpected {type(exc).__name__} reading the catalog: {exc}"
                    log.exception("catalog %s: unexpected error reading it", self.catalog_path)
                else:
                    self._catalog, self._catalog_error = cat, None
                    for name, problem in cat.problems.items():
                        log.error("catalog %s: model %s refused (the other models are served): %s",
                                  self.catalog_path, name, problem)
            if self._catalog is None:
                raise UnknownModel(f"this worker has no usable catalog: {self._catalog_error}")
            return self._catalog

    def catalog_problems(self) -> dict[str, str]:
        """What this worker refused of its catalog as last read: entry name -> problem, and the catalog
        file's own error under its path (a last good catalog is then in use, or none)."""
        with self._catalog_lock:
            problems = dict(self._catalog.problems) if self._catalog is not None else {}
            if self._catalog_error:
                problems[str(self.catalog_path)] = self._catalog_error
        return problems

    def entry(self, model: str, version: str | None) -> ModelEntry:
        cat = self.catalog()
        extra = f" (the catalog file has an error, the last good one is in use: {self._catalog_error})" \
            if self._catalog_error else ""
        refused = cat.problems.get(model)
        if refused is not None and (model not in cat or version and not any(
                m.version == version for m in cat.versions(model))):
            raise CatalogRefused(f"{refused} (this worker refused that catalog entry; it serves the others)"
                                 f"{extra}")
        if model not in cat:
            raise UnknownModel(f"unknown model {model!r}: not in the catalog {self.catalog_path} this worker "
                               f"serves{extra}")
        try:
            return cat.get(model, version or None)
        except KeyError:
            known = ", ".join(m.version for m in cat.versions(model))
            raise UnknownModel(f"unknown model version {model}@{version}: the catalog {self.catalog_path} has "
                               f"{model} in version(s) {known}{extra}") from None

