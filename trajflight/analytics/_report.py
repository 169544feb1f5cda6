"""``report``: one static HTML page of plots over live and archived groups, viewable with no server.

Six figures, each a PNG embedded in the page as base64 (and written to ``png_dir`` when asked):

* ``reward``: mean reward by policy version (with the standard error of each mean);
* ``length``: the response-length distribution of each epoch (box plots);
* ``finish``: the finish-reason mix of each epoch (stacked shares);
* ``staleness``: a histogram of ``staleness`` (trained version minus the sample's policy version);
* ``states``: groups per state over time, summed over the jobs shown;
* ``throughput``: groups committed and deleted per second over time.

The first four are drawn from the scanned rows (``trajflight.analytics.scan``: tokenless reads, no lease
taken or changed). The last two are drawn from the controller's timeline (every job's counts, sampled
by its sweeper): a live source's ``info`` action serves it; in an archive every data file carries it,
as it was when the file was written, in its Parquet footer.
A figure whose data the sources lack (``staleness`` of live groups, which have no lease facts; a
timeline of an archive written before timelines existed; ``finish_reason`` never given) is replaced
in the page, and in ``Report.figures``, by a sentence saying what is missing; the report never fails
for it.

What it does not guarantee: a snapshot (a live source is read as ``scan`` reads it, and its timeline
asked for after), or that a live plane's timeline spans more than the controller's current life (it
is kept in memory; an archive holds one file per controller that wrote it).
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from trajflight._archive import TIMELINE_KEY
from trajflight.analytics._archive import ArchiveSource
from trajflight.analytics._deps import HINT
from trajflight.analytics._scan import LIVE_SCHEMES, Source, scan
from trajflight.errors import ConfigError, DeadlineExceededError, InvalidRequestError, UnavailableError, brief

__all__ = ["FIGURES", "Figure", "Report", "report"]

FIGURES: tuple[tuple[str, str], ...] = (
    ("reward", "Reward by policy version"),
    ("length", "Response length by epoch"),
    ("finish", "Finish-reason mix by epoch"),
    ("staleness", "Staleness at training time"),
    ("states", "Groups per state over time"),
    ("throughput", "Throughput over time"),
)
"""Every figure of a report, as ``(key, title)``, in the page's order."""

_ROW_COLUMNS = ("epoch", "policy_version", "reward", "finish_reason", "staleness")
_NOT_STATES = frozenset({"deleted", "committed_total", "kept", "lost", "purged"})


@dataclass(frozen=True, slots=True)
class Figure:
    """One figure of a report: its PNG, or (``png`` None) the sentence that stands in its place.

    Attributes:
        key: Its key in :data:`FIGURES` (also its PNG's file name, ``<key>.png``).
        title: Its heading.
        png: The PNG's bytes, or None when the sources lack its data.
        note: What the figure shows, or why there is no data.
    """

    key: str
    title: str
    png: bytes | None
    note: str


@dataclass(frozen=True, slots=True)
class Report:
    """What :func:`report` made: the page, the PNG files, and every figure.

    Attributes:
        html: The page (also written to ``out`` when one was given).
        figures: The six figures, in :data:`FIGURES` order.
        out: The page's path, or None.
        pngs: The PNG files written (an empty tuple without ``png_dir``).
    """

    html: str
    figures: tuple[Figure, ...]
    out: Path | None
    pngs: tuple[Path, ...]


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise ConfigError(
            f"matplotlib is not installed: {HINT} brings it (reports draw with it)", setting="matplotlib"
        ) from exc
    matplotlib.use("Agg", force=True)  # files only: no display, no server
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=100)
    fig.clear()
    import matplotlib.pyplot as plt

    plt.close(fig)
    return buffer.getvalue()


# ---------------------------------------------------------------------------------------- rows


def _rows(sources: list[Source], job: str | None, epochs: Any, filesystem: Any, timeout: float) -> pa.Table:
    """The columns the row figures need, those the sources have (``response_length`` derived)."""
    plan = scan(sources, job=job, epochs=epochs, filesystem=filesystem, timeout=timeout)
    stored = plan.schema.names
    columns = [c for c in _ROW_COLUMNS if c in stored]
    if "response_ids" in stored:
        columns.append("response_length")
    return plan.select(columns).to_table() if columns else pa.table({})


def _valid(table: pa.Table, *names: str) -> pa.Table | None:
    """``table``'s ``names`` columns with rows where any is null dropped; None when a column is missing
    or no row is left."""
    if any(n not in table.column_names for n in names):
        return None
    sub = table.select(list(names)).drop_null()
    return sub if sub.num_rows else None


def _reward(plt: Any, rows: pa.Table) -> Figure | str:
    data = _valid(rows, "policy_version", "reward")
    if data is None:
        return "no data: the sources have no rows with both policy_version and reward"
    stats = data.group_by("policy_version").aggregate(
        [("reward", "mean"), ("reward", "stddev"), ("reward", "count")]
    )
    stats = stats.sort_by("policy_version")
    x = stats.column("policy_version").to_numpy()
    mean = stats.column("reward_mean").to_numpy(zero_copy_only=False)
    std = np.nan_to_num(stats.column("reward_stddev").to_numpy(zero_copy_only=False))
    n = stats.column("reward_count").to_numpy()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.errorbar(x, mean, yerr=std / np.sqrt(np.maximum(n, 1)), marker="o", capsize=3)
    ax.set_xlabel("policy version")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("mean reward")
    ax.grid(alpha=0.3)
    note = f"{data.num_rows} samples over {len(x)} policy versions; bars: standard error of the mean"
    return Figure("reward", "", _png(fig), note)


def _length(plt: Any, rows: pa.Table) -> Figure | str:
    data = _valid(rows, "epoch", "response_length")
    if data is None:
        return "no data: the sources have no response_ids (response lengths) with an epoch"
    epochs = sorted(set(data.column("epoch").to_pylist()))
    series = [data.filter(pc.field("epoch") == e).column("response_length").to_numpy() for e in epochs]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.boxplot(series, tick_labels=[str(e) for e in epochs], showfliers=False)
    ax.set_xlabel("epoch")
    ax.set_ylabel("response length (tokens)")
    ax.grid(alpha=0.3, axis="y")
    medians = ", ".join(f"{e}: {int(np.median(s))}" for e, s in zip(epochs, series, strict=True))
    return Figure("length", "", _png(fig), f"median response length by epoch ({medians}); whiskers 1.5 IQR")


def _finish(plt: Any, rows: pa.Table) -> Figure | str:
    data = _valid(rows, "epoch", "finish_reason")
    if data is None:
        return "no data: the sources' groups carry no finish_reason"
    reasons = data.column("finish_reason").cast(pa.string())
    data = data.set_column(1, "finish_reason", reasons)
    counts = data.group_by(["epoch", "finish_reason"]).aggregate([("finish_reason", "count")])
    epochs = sorted(set(counts.column("epoch").to_pylist()))
    names = sorted(set(counts.column("finish_reason").to_pylist()))
    share = np.zeros((len(names), len(epochs)))
    for e, r, c in zip(
        counts.column("epoch").to_pylist(),
        counts.column("finish_reason").to_pylist(),
        counts.column("finish_reason_count").to_pylist(),
        strict=True,
    ):
        share[names.index(r), epochs.index(e)] = c
    share /= share.sum(axis=0, keepdims=True)
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    bottom = np.zeros(len(epochs))
    labels = [str(e) for e in epochs]
    for i, name in enumerate(names):
        ax.bar(labels, share[i], bottom=bottom, label=name)
        bottom += share[i]
    ax.set_xlabel("epoch")
    ax.set_ylabel("share of samples")
    ax.legend(fontsize="small")
    return Figure("finish", "", _png(fig), f"{data.num_rows} samples; reasons: {', '.join(names)}")


def _staleness(plt: Any, rows: pa.Table) -> Figure | str:
    data = _valid(rows, "staleness")
    if data is None:
        return (
            "no data: no staleness column (the archive adds it at the commit; live groups, not trained "
            "yet, have none)"
        )
    values = data.column("staleness").to_numpy()
    low, high = int(values.min()), int(values.max())
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.hist(values, bins=np.arange(low - 0.5, high + 1.5, 1.0), rwidth=0.85)
    ax.set_xlabel("staleness (trained version - policy version)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("samples")
    ax.grid(alpha=0.3, axis="y")
    note = f"{len(values)} trained samples; mean staleness {values.mean():.2f}, max {high}"
    return Figure("staleness", "", _png(fig), note)


# ---------------------------------------------------------------------------------------- timeline


def _live_timeline(address: str, timeout: float) -> list[dict[str, Any]]:
    import trajflight

    try:
        with trajflight.connect(address, timeout=timeout) as client:
            info = getattr(client.controller.transport, "info", None)
            got = [] if info is None else info(timeout).get("timeline", [])
    except (UnavailableError, DeadlineExceededError) as exc:
        raise UnavailableError(
            f"the data plane at {brief(address)} could not be reached for its timeline "
            f"({type(exc).__name__}); check that it runs and that the address is right"
        ) from exc
    return list(got)


def _archive_timeline(location: Source, filesystem: pafs.FileSystem | None) -> list[dict[str, Any]]:
    """Every controller's samples, from the footers of the archive's data files (each file carries its
    writer's timeline as it was then: the newest copy of each run holds the others)."""
    import pyarrow.parquet as pq

    source = ArchiveSource(location, job=None, epochs=None, filesystem=filesystem)
    runs: dict[str, list[dict[str, Any]]] = {}
    for path in source.dataset.files:
        try:
            meta = pq.read_metadata(path, filesystem=source.dataset.filesystem).metadata or {}
            body = json.loads(meta[TIMELINE_KEY]) if TIMELINE_KEY in meta else None
        except (OSError, ValueError, pa.ArrowInvalid):
            continue  # an unreadable footer: the rows' figures say what the data does
        if isinstance(body, dict) and body.get("v") == 1 and isinstance(body.get("samples"), list):
            run = str(body.get("run"))
            if len(body["samples"]) >= len(runs.get(run, [])):
                runs[run] = [s for s in body["samples"] if isinstance(s, dict)]
    return [s for samples in runs.values() for s in samples]


def _series(samples: list[dict[str, Any]], job: str | None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Seconds since the first sample, and every count summed over the jobs shown (a count a sample
    leaves out is 0)."""
    samples = sorted(samples, key=lambda s: s["t"])
    t = np.array([s["t"] for s in samples], dtype=float)
    keys = sorted({k for s in samples for j, c in s["jobs"].items() if job in (None, j) for k in c})
    sums = {
        k: np.array(
            [sum(c.get(k, 0) for j, c in s["jobs"].items() if job in (None, j)) for s in samples], float
        )
        for k in keys
    }
    return t - (t[0] if len(t) else 0.0), sums


def _states(plt: Any, samples: list[dict[str, Any]], job: str | None) -> Figure | str:
    t, sums = _series(samples, job)
    states = [k for k in sums if k not in _NOT_STATES and sums[k].any()]
    if len(t) < 2 or not states:
        return "no data: no controller timeline with two samples or more (see the module docstring)"
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for k in states:
        ax.plot(t, sums[k], label=k, drawstyle="steps-post")
    ax.set_xlabel("seconds since the first sample")
    ax.set_ylabel("groups")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    return Figure("states", "", _png(fig), f"{len(t)} samples of the controller's counts over {t[-1]:.0f} s")


def _throughput(plt: Any, samples: list[dict[str, Any]], job: str | None) -> Figure | str:
    t, sums = _series(samples, job)
    if len(t) < 2:
        return "no data: no controller timeline with two samples or more (see the module docstring)"
    dt = np.maximum(np.diff(t), 1e-9)
    zeros = np.zeros(len(t))
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for key, label in (("committed_total", "committed"), ("deleted", "deleted (archived first)")):
        ax.plot(t[1:], np.diff(sums.get(key, zeros)) / dt, label=label, drawstyle="steps-pre")
    ax.set_xlabel("seconds since the first sample")
    ax.set_ylabel("groups / s")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    committed = sums.get("committed_total", zeros)
    total = committed[-1] - committed[0]
    note = f"{total:.0f} groups committed over {t[-1]:.0f} s ({total / max(t[-1], 1e-9):.1f} groups/s)"
    return Figure("throughput", "", _png(fig), note)


# ---------------------------------------------------------------------------------------- page


def _page(title: str, figures: Sequence[Figure]) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;max-width:60em;margin:auto}"
        "figure{margin:1.5em 0}.nodata{color:#a33}</style>",
        f"</head><body><h1>{html.escape(title)}</h1>",
    ]
    for f in figures:
        parts.append(f'<figure id="{f.key}"><h2>{html.escape(f.title)}</h2>')
        if f.png is None:
            parts.append(f'<p class="nodata">{html.escape(f.note)}</p>')
        else:
            data = base64.b64encode(f.png).decode()
            parts.append(f'<img alt="{html.escape(f.title)}" src="data:image/png;base64,{data}">')
            parts.append(f"<figcaption>{html.escape(f.note)}</figcaption>")
        parts.append("</figure>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def report(
    source: Source | Sequence[Source],
    *,
    out: str | os.PathLike[str] | None = "report.html",
    png_dir: str | os.PathLike[str] | None = None,
    job: str | None = None,
    epochs: int | Sequence[int] | None = None,
    filesystem: pafs.FileSystem | None = None,
    timeout: float = 30.0,
) -> Report:
    """Draw the six figures of :data:`FIGURES` over ``source`` into one static HTML page.

    Args:
        source: What :func:`~trajflight.analytics.scan` takes: a data plane address (live groups, and
            the controller's timeline from its ``info``), an archive location (archived groups, and
            the timelines in its files' footers), or a list of those.
        out: Where to write the page (replaced if it exists; its folder made if missing); None writes no
            page (``Report.html`` still holds it).
        png_dir: Also write each drawn figure there as ``<key>.png`` (made if missing); None: none.
        job: Only this job (rows and timeline). epochs: Only these epochs (rows only).
        filesystem: The ``pyarrow.fs`` filesystem of archive paths (an S3 ``endpoint_override``).
        timeout: Deadline of each data plane call, seconds.

    Returns:
        A :class:`Report`: the page, and every figure with its PNG or the "no data" sentence that
        stands in its place (a figure whose data the sources lack never fails the report).

    Raises:
        InvalidRequestError: a bad argument (as ``scan`` raises them). NotFoundError: no archive at a
            location. UnavailableError: a data plane that cannot be reached. SchemaError: sources whose
            columns disagree. ConfigError: matplotlib is not installed. OSError: ``out`` or ``png_dir``
            cannot be written.
    """
    sources = [source] if isinstance(source, str | os.PathLike) else list(source)
    if not sources:
        raise InvalidRequestError("report needs a source: a data plane address or an archive location")
    plt = _pyplot()
    rows = _rows(sources, job, epochs, filesystem, timeout)
    samples: list[dict[str, Any]] = []
    for s in sources:
        if isinstance(s, str) and s.startswith(LIVE_SCHEMES):
            samples.extend(_live_timeline(s, timeout))
        else:
            samples.extend(_archive_timeline(s, filesystem))
    made = [
        _reward(plt, rows),
        _length(plt, rows),
        _finish(plt, rows),
        _staleness(plt, rows),
        _states(plt, samples, job),
        _throughput(plt, samples, job),
    ]
    figures = tuple(
        Figure(key, title, m.png, m.note) if isinstance(m, Figure) else Figure(key, title, None, m)
        for (key, title), m in zip(FIGURES, made, strict=True)
    )
    names = ", ".join(os.fspath(s) for s in sources)
    page = _page(f"trajflight report: {names}" + (f", job {job}" if job else ""), figures)
    path = None if out is None else Path(out)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)  # as png_dir is: `-o out/report.html` just works
        tmp = path.with_name(f".tmp-{path.name}")
        tmp.write_text(page, encoding="utf-8")
        tmp.replace(path)
    pngs: list[Path] = []
    if png_dir is not None:
        folder = Path(png_dir)
        folder.mkdir(parents=True, exist_ok=True)
        for f in figures:
            if f.png is not None:
                (folder / f"{f.key}.png").write_bytes(f.png)
                pngs.append(folder / f"{f.key}.png")
    return Report(page, figures, path, tuple(pngs))


# ---------------------------------------------------------------------------------------- command line


def add_arguments(parser: Any) -> None:
    """Register the options of ``trajflight report``."""
    parser.add_argument(
        "source", help="a data plane address (grpc://HOST:PORT, ray://NS/NAME) or an archive location"
    )
    parser.add_argument("-o", "--out", default="report.html", help="the HTML page to write (report.html)")
    parser.add_argument("--png", metavar="DIR", default=None, help="also write each figure to DIR/<key>.png")
    parser.add_argument(
        "--also", metavar="SOURCE", action="append", default=[], help="another source (repeat)"
    )
    parser.add_argument("--job", default=None, help="only this job")
    parser.add_argument(
        "--epoch", type=int, action="append", default=None, help="only this epoch (repeat for several)"
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="deadline of each data plane call, s")


def run(args: Any) -> int:
    """Write the report; print where and which figures had no data. Returns 0, or 2 with one line on
    stderr (an unreachable or missing source, an unwritable output)."""
    import sys

    from trajflight.errors import TrajflightError

    try:
        made = report(
            [args.source, *args.also],
            out=args.out,
            png_dir=args.png,
            job=args.job,
            epochs=args.epoch,
            timeout=args.timeout,
        )
    except (TrajflightError, OSError) as exc:
        print(f"trajflight report: {exc}", file=sys.stderr)
        return 2
    drawn = sum(f.png is not None for f in made.figures)
    print(f"trajflight report: wrote {made.out} ({drawn} of {len(made.figures)} figures drawn)")
    for f in made.figures:
        if f.png is None:
            print(f"  {f.key}: {f.note}")
    if made.pngs:
        print(f"  PNGs in {args.png}: {', '.join(p.name for p in made.pngs)}")
    return 0
