"""Reading a ``trajflight bench`` result: ratios, the performance targets, a text table and a PNG chart.

Ratios compare throughputs measured in the same run (``a/b`` > 1: a is faster); for latency and the
handoff the ratio is b's p50 over a's. The targets are trajflight's performance goals against each peer's
**strongest** ordinary form (TransferQueue; Ray with one object per batch, ``ray``; a bare Flight server
with one stream of the batch, ``flight``), the raw shared-memory ceiling and its own latencies; the
weaker forms (``ray-per-group``, ``flight-per-group``) are shown and kept in the JSON's ratios, never
judged by. A ``--quick`` run is too small to judge them, and says so. The text table fits 110 columns.
The chart needs matplotlib (optional: ``pip install 'trajflight[bench]'``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["add_ratios_and_targets", "draw_chart", "format_markdown", "format_table", "missed_targets"]

FIGURES: tuple[tuple[str, str], ...] = (
    ("put", "put"),
    ("get_all_jagged", "get all, jagged"),
    ("get_all_padded", "get all, padded"),
    ("get_subset_jagged", "get 2-col, jagged"),
    ("get_subset_padded", "get 2-col, padded"),
)
# Shown where a system's public API has a batched put (trajflight's: Writer.put_many).
OPTIONAL_FIGURES: tuple[tuple[str, str], ...] = (("put_batched", "put, batched"),)
# Column headings of the text table, short enough for 100 columns (the legend under it spells them out).
SHORT: dict[str, str] = {
    "put": "put",
    "get_all_jagged": "all/jagged",
    "get_all_padded": "all/padded",
    "get_subset_jagged": "2col/jagged",
    "get_subset_padded": "2col/padded",
    "put_batched": "put many",
    "latency_p50": "p50",
    "handoff_p50": "handoff",
}
# The ratio table's columns and their headings (9 characters at most: the table fits 110 columns).
RATIO_KEYS: tuple[tuple[str, str], ...] = (
    ("put", "put"),
    ("put_batched", "put many"),
    ("get_all_jagged", "all/jag"),
    ("get_all_padded", "all/pad"),
    ("get_subset_jagged", "2col/jag"),
    ("get_subset_padded", "2col/pad"),
    ("latency_p50", "p50"),
    ("handoff_p50", "handoff"),
)
WIDTH = 110
STRONGEST_NOTE = "ratios and targets compare with each peer's strongest form (marked *)"
QUICK_NOTE = "not judged under --quick (tiny data)"
CHART_HINT = "pip install 'trajflight[bench]'  (matplotlib)"


def _ok(doc: dict[str, Any], name: str) -> dict[str, Any] | None:
    system = doc["systems"].get(name)
    return system if system is not None and system["status"] == "ok" else None


def ours_names(doc: dict[str, Any]) -> list[str]:
    """The trajflight entries that ran (role ``system``), the default transport first."""
    return [n for n, s in doc["systems"].items() if s["role"] == "system" and s["status"] == "ok"]


def _strongest(system: dict[str, Any]) -> bool:
    return bool(system.get("strongest", True))


def add_ratios_and_targets(doc: dict[str, Any]) -> dict[str, Any]:
    """Add ``ratios`` (each trajflight entry over every other system, per figure) and ``targets``.

    Ratio keys read ``"<figure> <ours>/<other>"``: the throughputs, ``put_batched`` where both have a
    batched put, ``latency_p50`` and ``handoff_p50`` where both measured it. Targets are judged for every
    trajflight entry that ran (``trajflight``: the default transport; ``trajflight-flight``: Flight
    forced), ids prefixed with it, against the peers' strongest forms only.
    """
    ratios: dict[str, float] = {}
    ours_list = ours_names(doc)
    for name in ours_list:
        ours = doc["systems"][name]
        for other in doc["systems"]:
            theirs = _ok(doc, other)
            if other == name or theirs is None:
                continue
            for key, _ in (*FIGURES, *OPTIONAL_FIGURES):
                if key in ours and key in theirs:
                    ratios[f"{key} {name}/{other}"] = ours[key]["GBps"] / theirs[key]["GBps"]
            ratios[f"latency_p50 {name}/{other}"] = theirs["latency"]["p50_ms"] / ours["latency"]["p50_ms"]
            if "handoff" in ours and "handoff" in theirs:
                ratios[f"handoff_p50 {name}/{other}"] = (
                    theirs["handoff"]["p50_ms"] / ours["handoff"]["p50_ms"]
                )
    doc["ratios"] = ratios

    targets: list[dict[str, Any]] = []

    quick = bool(doc.get("config", {}).get("quick"))

    def target(
        id_: str, description: str, threshold: float, value: float | None, note: str, lower: bool = False
    ) -> None:
        met = None if value is None else (value <= threshold if lower else value >= threshold)
        if quick and met is not None:  # a quick run measures too little to judge a target by
            met, note = None, QUICK_NOTE
        targets.append(
            {
                "id": id_,
                "description": description,
                "threshold": threshold,
                "value": value,
                "met": met,
                "note": note,
            }
        )

    for name in ours_list or ["trajflight"]:
        for key, label in (*FIGURES, *OPTIONAL_FIGURES):
            for peer, threshold, why in (
                ("transferqueue", 5.0, ">= 5x TransferQueue"),
                ("flight", 0.8, ">= 0.8x bare Flight, one stream"),
            ):
                value = ratios.get(f"{key} {name}/{peer}")
                note = "" if value is not None else f"not measured ({peer} did not run)"
                target(f"{name}: {key} vs {peer}", f"{name}: {label} {why}", threshold, value, note)
            if key != "put":
                value = ratios.get(f"{key} {name}/ray")
                note = "" if value is not None else "not measured (ray did not run)"
                what = f"{label} >= Ray, one object" if key == "put_batched" else f"{label} to torch >= Ray"
                target(f"{name}: {key} vs ray", f"{name}: {what}", 1.0, value, note)
        ours = _ok(doc, name)
        p50 = ours["latency"]["p50_ms"] if ours is not None else None
        target(
            f"{name}: small-group p50",
            f"{name}: 1 small group put + lease + get, p50 <= 3 ms",
            3.0,
            p50,
            "" if p50 is not None else f"not measured ({name} did not run)",
            lower=True,
        )
        handoff = ours["handoff"]["p50_ms"] if ours is not None and "handoff" in ours else None
        target(
            f"{name}: handoff p50",
            f"{name}: 1 group, writer process -> waiting trainer process, p50 <= 2 ms",
            2.0,
            handoff,
            "" if handoff is not None else f"not measured ({name} did not run)",
            lower=True,
        )
    doc["targets"] = targets
    return doc


def missed_targets(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets the run judged and missed (``met`` is false)."""
    return [t for t in doc["targets"] if t["met"] is False]


def _ratio_rows(doc: dict[str, Any], strongest_only: bool = False) -> list[tuple[str, str]]:
    """The ``(ours, other)`` pairs of the ratios, in the systems' order; ``strongest_only``: only
    against references and the peers' strongest forms (what the tables show)."""
    pairs = {tuple(k.split(" ", 1)[1].split("/")) for k in doc["ratios"]}
    systems = doc["systems"]
    if strongest_only:
        pairs = {p for p in pairs if _strongest(systems[p[1]])}
    order = list(systems)
    return sorted(pairs, key=lambda p: (order.index(p[0]), order.index(p[1])))  # type: ignore[return-value]


def _label(name: str, system: dict[str, Any]) -> str:
    """A system's name in a table: a ``*`` marks a peer's strongest form."""
    return name + ("*" if system["role"] == "peer" and _strongest(system) else "")


def _cell(op: dict[str, Any]) -> str:
    return f"{op['GBps']:.3g} [{op['GBps_min']:.2g}-{op['GBps_max']:.2g}]"


def _short_cell(op: dict[str, Any]) -> str:
    """Median and half the min-max range, relative: ``1.32±23%`` (fits a 13-column cell)."""
    spread = (op["GBps_max"] - op["GBps_min"]) / 2 / op["GBps"] * 100 if op["GBps"] else 0.0
    return f"{op['GBps']:.3g}±{spread:.0f}%"


def format_table(doc: dict[str, Any]) -> str:
    """The human-readable summary (within 110 columns): the systems and their forms, throughput, latency,
    handoff and memory per system, ratios against the strongest forms, targets."""
    cfg = doc["config"]
    machine = doc["machine"]
    users = ", ".join(cfg.get("user_columns", [])) or "none"
    lines = [
        f"trajflight bench {doc['started']}: G={cfg['groups']} K={cfg['samples']} seed={cfg['seed']}, "
        f"payload {cfg['payload_bytes'] / 1e6:.2f} MB (2-col {cfg['subset_payload_bytes'] / 1e6:.2f} MB)",
        f"  user columns (extra=): {users}; {cfg['repeats']} timed rounds, {machine['cpus']} CPUs, "
        f"load average {machine['loadavg_before'][0]:.2f} -> {machine['loadavg_after'][0]:.2f}",
        *(["  --quick: tiny data, a smoke test, not a measurement"] if cfg.get("quick") else []),
        "",
        f"Systems: {STRONGEST_NOTE}",
    ]
    for name, system in doc["systems"].items():
        lines.append(f"  {_label(name, system):19s}{system['role']:10s}{system.get('form', '')}"[:WIDTH])
    lines += ["", "Throughput, GB/s of payload: median ± half the min-max range over the rounds"]
    shown = FIGURES + OPTIONAL_FIGURES
    header = f"{'system':19s}" + "".join(f"{SHORT[key]:>13s}" for key, _ in shown)
    lines += [header, "-" * len(header)]
    for name, system in doc["systems"].items():
        label = _label(name, system)
        if system["status"] != "ok":
            reason = f"{label:19s}{system['status'].upper()}: {system['reason']}"
            lines.append(reason[:WIDTH])
            if system["hint"]:
                lines.append(f"{'':19s}-> {system['hint']}"[:WIDTH])
            continue
        cells = [_short_cell(system[key]) if key in system else "-" for key, _ in shown]
        lines.append(f"{label:19s}" + "".join(f"{c:>13s}" for c in cells))
        singles = system.get("gets_after_single_puts")
        if singles:  # the gets of the row above follow the batched put; these, one put per group
            cells = [_short_cell(singles[key]) if key in singles else "" for key, _ in shown]
            lines.append(f"{'  after 1 put/group':19s}" + "".join(f"{c:>13s}" for c in cells))
    lines += [
        "  all: every column; 2col: response_ids and response_logprobs; jagged/padded: the torch",
        "  layout; put: one call per group (a form with no such call: its batch put); put many: one call",
        "  for the whole workload; trajflight's gets follow its put many (one batch, as the peers' strongest",
        "  forms move it); 'after 1 put/group': the same gets after one put per group (a join copies)",
        "",
        "Small groups, handoff and memory (peak RSS growth per payload byte)",
        f"{'system':19s}{'put groups/s':>13s}{'p50 ms':>8s}{'p99 ms':>8s}{'handoff p50':>12s}"
        f"{'p99 ms':>8s}{'client B/B':>11s}{'servers B/B':>12s}",
    ]
    for name, system in doc["systems"].items():
        if system["status"] != "ok":
            continue
        mem = system["memory"]
        servers = mem["servers_per_payload_byte"]
        handoff = system.get("handoff")
        h50, h99 = (f"{handoff['p50_ms']:.2f}", f"{handoff['p99_ms']:.2f}") if handoff else ("-", "-")
        lines.append(
            f"{_label(name, system):19s}{system['put']['groups_per_s']:>13,.0f}"
            f"{system['latency']['p50_ms']:>8.2f}{system['latency']['p99_ms']:>8.2f}{h50:>12s}{h99:>8s}"
            f"{mem['client_per_payload_byte']:>11.2f}{('-' if servers is None else f'{servers:.2f}'):>12s}"
        )
    lines += [
        "  p50/p99: put 1 group + grant + get to torch, in one process; handoff: 1 group from a writer",
        "  process to a trainer process already waiting for it (in lease, for trajflight)",
    ]
    ours = next((doc["systems"][n] for n in ours_names(doc) if "controller" in doc["systems"][n]), None)
    if ours is not None:
        c = ours["controller"]["group_cycles_per_s"]
        lines += [
            "",
            f"controller: {c['median']:,.0f} lease cycles/s ({c['min']:,.0f}-{c['max']:,.0f}), "
            f"{ours['controller']['transitions_per_s']:,.0f} transitions/s, "
            f"{ours['controller']['groups_per_lease']} groups a lease",
        ]
    rows = _ratio_rows(doc, strongest_only=True) if doc["ratios"] else []
    if rows:
        lines += [
            "",
            "Ratios, trajflight / other, against references and each peer's strongest form (throughput;",
            "p50, handoff: other's over ours); > 1: trajflight faster; the JSON has every pair",
        ]
        width = max(len(f"{a} / {b}") for a, b in rows) + 2
        lines.append(f"{'ours / other':{width}s}" + "".join(f"{head:>9s}" for _, head in RATIO_KEYS))
        for a, b in rows:
            cells = []
            for key, _ in RATIO_KEYS:
                value = doc["ratios"].get(f"{key} {a}/{b}")
                cells.append("-" if value is None else f"{value:.2f}")
            lines.append(f"{a + ' / ' + b:{width}s}" + "".join(f"{c:>9s}" for c in cells))
    lines += ["", *_target_lines(doc)]
    return "\n".join(lines)


def _target_lines(doc: dict[str, Any]) -> list[str]:
    """The targets: one line per judged target; the unjudged ones counted by why."""
    targets = doc["targets"]
    judged = [t for t in targets if t["met"] is not None]
    lines = [
        "Targets (trajflight against each peer's strongest form: TransferQueue, Ray with one object per",
        "batch, bare Flight with one stream of the batch; and its own latencies)",
    ]
    for t in judged:
        state = "MET " if t["met"] else "MISS"
        lines.append(f"  {state} {t['description']}: {t['value']:.2f} (target {t['threshold']:g})")
    reasons: dict[str, int] = {}
    for t in targets:
        if t["met"] is None:
            reasons[t["note"] or "not measured"] = reasons.get(t["note"] or "not measured", 0) + 1
    for note, n in sorted(reasons.items()):
        lines.append(f"  n/a  {n} target{'s' if n != 1 else ''}: {note}"[:WIDTH])
    if judged:
        missed = sum(1 for t in judged if not t["met"])
        lines.append(f"  {len(judged) - missed} met, {missed} missed; `--check` exits 1 when one is missed")
    return lines


def draw_chart(doc: dict[str, Any], path: str) -> str | None:
    """Draw throughput (log scale, min-max error bars) and latency bars to ``path`` (PNG).

    Returns:
        ``None`` when drawn, else why not (matplotlib missing, with the install hint).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"no chart: matplotlib is not installed; {CHART_HINT}"
    names = [n for n, s in doc["systems"].items() if s["status"] == "ok"]
    if not names:
        return "no chart: no system ran"
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 5.0), gridspec_kw={"width_ratios": [3.2, 1]})
    width = 0.8 / len(names)
    shown = FIGURES + OPTIONAL_FIGURES
    for i, name in enumerate(names):
        system = doc["systems"][name]
        present = [(j, key) for j, (key, _) in enumerate(shown) if key in system]
        medians = [system[k]["GBps"] for _, k in present]
        lo = [m - system[k]["GBps_min"] for m, (_, k) in zip(medians, present, strict=True)]
        hi = [system[k]["GBps_max"] - m for m, (_, k) in zip(medians, present, strict=True)]
        xs = [j + (i - (len(names) - 1) / 2) * width for j, _ in present]
        ax.bar(xs, medians, width, yerr=[lo, hi], capsize=2, label=name)
    ax.set_yscale("log")
    ax.set_xticks(range(len(shown)), [label for _, label in shown], fontsize=8, rotation=12)
    ax.set_ylabel("GB/s of payload (median, min-max)")
    cfg = doc["config"]
    ax.set_title(
        f"throughput, G={cfg['groups']} K={cfg['samples']}, {cfg['payload_bytes'] / 1e6:.1f} MB", fontsize=10
    )
    ncol = min(5, len(names))
    ax.legend(fontsize=8, ncol=ncol, loc="upper center", bbox_to_anchor=(0.5, -0.12), frameon=False)
    ax.grid(axis="y", alpha=0.3, which="both")
    p50 = [doc["systems"][n]["latency"]["p50_ms"] for n in names]
    p99 = [doc["systems"][n]["latency"]["p99_ms"] for n in names]
    colors = [f"C{i}" for i in range(len(names))]  # the same colour per system as on the left
    ax2.bar(range(len(names)), p99, 0.6, color="lightgray")
    ax2.bar(range(len(names)), p50, 0.6, color=colors)
    ax2.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
    ax2.set_yscale("log")
    ax2.set_ylabel("ms")
    ax2.set_title("1 group: put + lease + get\np50 (colour), p99 (grey)", fontsize=9)
    ax2.grid(axis="y", alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return None


def format_markdown(doc: dict[str, Any]) -> str:
    """The same summary as :func:`format_table`, as Markdown tables (for ``BENCHMARKS.md``)."""
    cfg, machine = doc["config"], doc["machine"]
    shown = FIGURES + OPTIONAL_FIGURES
    out = [
        f"Run {doc['started']}, {doc['duration_s']:.0f} s: G={cfg['groups']} K={cfg['samples']} "
        f"seed={cfg['seed']}, payload {cfg['payload_bytes'] / 1e6:.2f} MB (2-column subset "
        f"{cfg['subset_payload_bytes'] / 1e6:.2f} MB), {cfg['repeats']} timed rounds, "
        f"{cfg['latency_iters']} latency round trips per system; {machine['cpus']} CPUs, Python "
        f"{machine['python']}, pyarrow {machine['pyarrow']}, torch {machine['torch']}; load average "
        f"{machine['loadavg_before'][0]:.2f} before, {machine['loadavg_after'][0]:.2f} after. User columns "
        f"(`extra=`): {', '.join(cfg.get('user_columns', [])) or 'none'}.",
        "",
        f"Throughput, GB/s of payload, median [min-max] over the rounds; {STRONGEST_NOTE}. put: one call "
        "per group (a form with no such call: its batch put); put, batched: one call for the workload:",
        "",
        "| system | form | " + " | ".join(label for _, label in shown) + " |",
        "|---|---|" + "---:|" * len(shown),
    ]
    for name, system in doc["systems"].items():
        label, form = _label(name, system), system.get("form", "")
        if system["status"] != "ok":
            hint = f" (`{system['hint']}`)" if system["hint"] else ""
            out.append(
                f"| {label} | {form} | {system['status']}: {system['reason']}{hint} |"
                + " |" * (len(shown) - 1)
            )
            continue
        cells = [_cell(system[key]) if key in system else "-" for key, _ in shown]
        out.append(f"| {label} | {form} | " + " | ".join(cells) + " |")
    out += [
        "",
        "Small groups (put 1 group + grant + get to torch, one process), the cross-process handoff (1 group "
        "from a writer process to a trainer process already waiting for it) and memory:",
        "",
        "| system | put groups/s | small-group p50 ms | p99 ms | handoff p50 ms | handoff p99 ms "
        "| client peak RSS growth / payload byte | servers peak RSS growth / payload byte "
        "| servers counted |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, system in doc["systems"].items():
        if system["status"] != "ok":
            continue
        mem, lat = system["memory"], system["latency"]
        servers = mem["servers_per_payload_byte"]
        handoff = system.get("handoff")
        h50, h99 = (f"{handoff['p50_ms']:.2f}", f"{handoff['p99_ms']:.2f}") if handoff else ("-", "-")
        out.append(
            f"| {_label(name, system)} | {system['put']['groups_per_s']:,.0f} | {lat['p50_ms']:.2f} "
            f"| {lat['p99_ms']:.2f} | {h50} | {h99} | {mem['client_per_payload_byte']:.2f} "
            f"| {'-' if servers is None else f'{servers:.2f}'} | {mem['servers_counted']} |"
        )
    ours = next((doc["systems"][n] for n in ours_names(doc) if "controller" in doc["systems"][n]), None)
    if ours is not None:
        c = ours["controller"]["group_cycles_per_s"]
        out += [
            "",
            f"trajflight controller: **{c['median']:,.0f} group lease cycles/s** "
            f"[{c['min']:,.0f}-{c['max']:,.0f}] "
            f"({ours['controller']['transitions_per_s']:,.0f} state transitions/s, "
            f"{ours['controller']['groups_per_lease']} groups per lease, in-process host).",
        ]
    rows = _ratio_rows(doc, strongest_only=True) if doc["ratios"] else []
    if rows:
        keys = [k for k, _ in RATIO_KEYS]
        out += [
            "",
            "Ratios, trajflight / other, against the references and each peer's strongest form (throughput; "
            "for latency and the handoff, other's p50 / trajflight's); > 1: trajflight faster:",
            "",
            "| ours / other | " + " | ".join(keys) + " |",
            "|---|" + "---:|" * len(keys),
        ]
        for ours, other in rows:
            cells = []
            for k in keys:
                value = doc["ratios"].get(f"{k} {ours}/{other}")
                cells.append("-" if value is None else f"{value:.2f}")
            out.append(f"| {ours} / {other} | " + " | ".join(cells) + " |")
    out += ["", "| target | value | threshold | verdict |", "|---|---:|---:|---|"]
    for t in doc["targets"]:
        verdict = (t["note"] or "not measured") if t["met"] is None else ("met" if t["met"] else "**missed**")
        value = "-" if t["value"] is None else f"{t['value']:.2f}"
        out.append(f"| {t['description']} | {value} | {t['threshold']:g} | {verdict} |")
    return "\n".join(out)
