"""The text form of a run's figures."""

from __future__ import annotations

from .files import GiB, MiB


def fmt_report(r: dict) -> str:
    def gb(k: str) -> str:
        v = r.get(k)
        return f"{v:7.2f} GiB/s" if isinstance(v, int | float) else "      n/a"

    lines = [
        f"prewarm bench load: {r['model_bytes'] / GiB:.2f} GiB model ({r['tensors']} tensors) -> {r['device']}, "
        f"median of {r['runs']} runs, {r['threads']} threads, {r['chunk_bytes'] // MiB} MiB chunks, "
        f"{r['cpu_count']} CPUs, load average {r['load_average']}",
        "",
        "page cache                 median       [min..max GiB/s]",
    ]
    for key, label in (("raw_read", "raw read (cat-like)"), ("loader", "loader"),
                       ("load_file", "load_file + copy"), ("fresh_memcpy", "memcpy, same allocations"),
                       ("loader_prefaulted", "loader, pre-faulted dest"),
                       ("prefaulted_memcpy", "memcpy, pre-faulted dest")):
        if key in r["spread_gib_s"]:
            lo, hi = r["spread_gib_s"][key]
            lines.append(f"  {label:24s} {gb(key + '_gib_s')}  [{lo}..{hi}]")
    lines += [
        f"  loader / raw read        {r['ratio_to_raw_read']:.2f}x  (into new memory: the CPU virtual GPU's load)",
        f"  loader / load_file       {r['ratio_to_load_file']:.2f}x",
        f"  loader / memcpy ceiling  {r['ratio_to_fresh_memcpy']:.2f}x",
    ]
    if "prefaulted_ratio_to_raw_read" in r:
        lines += [
            f"  pre-faulted / raw read   {r['prefaulted_ratio_to_raw_read']:.2f}x  (into mapped memory: a GPU load's analogue)",
            f"  pre-faulted / memcpy     {r['prefaulted_ratio_to_memcpy']:.2f}x",
        ]
    if "idle_loader_gib_s" in r:
        idle = f"  after {r['idle_seconds']:g} s idle: loader {gb('idle_loader_gib_s').strip()}"
        if "idle_loader_prefaulted_gib_s" in r:
            idle += f", pre-faulted {gb('idle_loader_prefaulted_gib_s').strip()}"
        lines.append(idle)
    huge = [f"{label} {r[k]:.0%}" for k, label in (("loader_huge_page_fraction", "loader"),
                                                   ("prefaulted_huge_page_fraction", "pre-faulted arena"))
            if isinstance(r.get(k), int | float)]
    if huge:
        lines.append("  huge-page backed: " + ", ".join(huge))
    lines.append("  CPU s/GiB: " + ", ".join(f"{k} {v:.3f}" for k, v in r["cpu_s_per_gib"].items()))
    if r.get("peak_rss_bytes"):
        lines += [
            "",
            f"peak RSS of a loading process: {r['peak_rss_bytes'] / MiB:.0f} MiB "
            f"({r['peak_rss_over_baseline_bytes'] / MiB:.0f} MiB over its {r['baseline_rss_bytes'] / MiB:.0f} MiB "
            f"baseline; bound model + pool = {r['peak_rss_bound_bytes'] / MiB:.0f} MiB; "
            f"within: {r['peak_within_bound']})",
        ]
        if "load_file_peak_rss_over_baseline_bytes" in r:
            lines.append(
                f"  load_file + copy for comparison: {r['load_file_peak_rss_over_baseline_bytes'] / MiB:.0f} MiB over baseline"
            )
    if "cold_loader_gib_s" in r:
        lines += ["", f"out of page cache (fadvise DONTNEED before each run; resident after drop "
                      f"<= {r['cold_resident_fraction_after_drop']})"]
        for key, label in (("raw_read", "raw read"), ("loader", "loader"), ("load_file", "load_file + copy")):
            lo, hi = r["cold_spread_gib_s"][key]
            lines.append(f"  {label:24s} {gb('cold_' + key + '_gib_s')}  [{lo}..{hi}]")
        lines += [
            f"  loader / raw read        {r['cold_ratio_to_raw_read']:.2f}x",
            f"  loader / load_file       {r['cold_ratio_to_load_file']:.2f}x",
        ]
    lines += [
        "",
        f"host cache: stage {gb('stage_gib_s')}, promote staged -> {r['device']} {gb('promote_gib_s')} "
        f"({r['promote_speedup_over_loader']:.2f}x the loader from page cache; pinned: {r['staged_pinned']})",
    ]
    if "h2d_pinned_gib_s" in r:
        lines.append(
            f"pinned H2D {gb('h2d_pinned_gib_s')}; loader share {r['loader_share_of_h2d']:.2f}, "
            f"promote share {r['promote_share_of_h2d']:.2f}"
        )
    return "\n".join(lines)
