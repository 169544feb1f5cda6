"""``trajflight.analytics.report`` and ``trajflight report``: six figures over an archive or a live plane,
one static HTML page with the PNGs embedded, "no data" in a figure's place when its data is missing."""

from __future__ import annotations

import base64
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

import trajflight
from tests.analytics.conftest import put_rich
from trajflight.analytics import FIGURES, report
from trajflight.errors import NotFoundError, UnavailableError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
KEYS = [key for key, _ in FIGURES]


class _Page(HTMLParser):
    """The figures of a report page: each ``<figure id=...>`` with its images and "no data" notes."""

    def __init__(self) -> None:
        super().__init__()
        self.figures: dict[str, dict[str, list[str]]] = {}
        self._current: str | None = None
        self._in_note = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "figure":
            self._current = a["id"]
            self.figures[self._current or ""] = {"img": [], "nodata": []}
        elif tag == "img" and self._current:
            self.figures[self._current]["img"].append(a["src"] or "")
        elif tag == "p" and a.get("class") == "nodata":
            self._in_note = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "figure":
            self._current = None
        self._in_note = False

    def handle_data(self, data: str) -> None:
        if self._in_note and self._current:
            self.figures[self._current]["nodata"].append(data)


def _parse(page: str) -> dict[str, dict[str, list[str]]]:
    parser = _Page()
    parser.feed(page)
    parser.close()
    return parser.figures


def _check_page(page: str, drawn: set[str]) -> dict[str, dict[str, list[str]]]:
    """Every figure is present, in order; the drawn ones hold one embedded PNG, the others a sentence."""
    figures = _parse(page)
    assert list(figures) == KEYS
    for key, parts in figures.items():
        if key in drawn:
            (src,) = parts["img"]
            assert src.startswith("data:image/png;base64,")
            assert base64.b64decode(src.split(",", 1)[1]).startswith(PNG_MAGIC)
            assert parts["nodata"] == []
        else:
            assert parts["img"] == []
            (note,) = parts["nodata"]
            assert note.startswith("no data: ")
    return figures


def _trained_archive(tmp_path: Path, job: str) -> Path:
    """An archive of a small LocalCluster run: two epochs of rich groups put, leased and committed."""
    root = tmp_path / "archive"
    with (
        trajflight.LocalCluster(servers=1, processes=False, archive=root, archive_flush=0.2) as cluster,
        cluster.client() as client,
    ):
        for epoch in (1, 2):
            put_rich(client, job, 6, epoch=epoch)
            trainer = client.trainer(job, owner="trainer-a")
            done = 0
            while done < 6:
                with trainer.lease(6 - done, wait=20.0) as batch:
                    batch.fetch_table()
                    done += len(batch.partitions)
            assert cluster.wait_idle(job, timeout=30.0) == (0, 0)
    return root


def test_a_report_over_an_archive_draws_all_six_figures(tmp_path, job):
    """Issue 17: an archive of a LocalCluster run holds what every figure needs: the rows (staleness
    included) and, in its files' footers, the controller's timeline."""
    root = _trained_archive(tmp_path, job)
    out, pngs = tmp_path / "new" / "report.html", tmp_path / "png"  # out's folder is made, as png_dir is
    made = report(root, out=out, png_dir=pngs)
    page = out.read_text(encoding="utf-8")
    assert page == made.html
    _check_page(page, drawn=set(KEYS))
    assert sorted(p.name for p in pngs.iterdir()) == sorted(f"{k}.png" for k in KEYS)
    for key in KEYS:
        assert (pngs / f"{key}.png").read_bytes().startswith(PNG_MAGIC)
    notes = {f.key: f.note for f in made.figures}
    assert notes["reward"].startswith("36 samples over 3 policy versions")  # 2 epochs x 6 groups x 3
    assert "1: " in notes["length"]
    assert "2: " in notes["length"]
    assert notes["finish"].endswith("reasons: length, stop")


def test_a_report_over_a_live_plane_says_which_figures_have_no_data(plane, client, job, tmp_path):
    """Live groups have no lease facts: staleness is "no data", the other five are drawn (the timeline
    comes from the controller's ``info``); nothing is leased or changed by the report."""
    put_rich(client, job, 4)
    before = client.controller.counts(job)
    assert plane.controller is not None
    for _ in range(100):  # the sweeper samples every 0.25 s: wait (up to 10 s) for two with this job
        if sum(job in s["jobs"] for s in plane.controller.timeline()) >= 2:
            break
        time.sleep(0.1)
    made = report(plane.address, out=tmp_path / "live.html", job=job)
    figures = _check_page(made.html, drawn={"reward", "length", "finish", "states", "throughput"})
    assert "staleness" in figures["staleness"]["nodata"][0]
    assert client.controller.counts(job) == before
    assert made.pngs == ()


def test_a_source_without_timeline_or_rows_reports_no_data_for_each_figure(tmp_path):
    """An archive written by hand (no timeline, only some columns) still gives a page: each missing
    figure says so in its place."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "bare" / "job_id=j" / "epoch=1"
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"group_id": [1, 1], "reward": [0.0, 1.0]}), folder / "part-0.parquet")
    made = report(tmp_path / "bare", out=None)
    assert made.out is None
    _check_page(made.html, drawn=set())


def test_bad_sources_raise_typed_errors(tmp_path):
    with pytest.raises(NotFoundError, match="no archive at"):
        report(tmp_path / "missing", out=tmp_path / "r.html")
    with pytest.raises(UnavailableError):
        report("grpc://127.0.0.1:1", out=tmp_path / "r.html", timeout=2.0)
    assert not (tmp_path / "r.html").exists()


def test_the_command_writes_the_page_and_fails_with_one_line(tmp_path):
    """The command's success path over a full archive runs in tests/archive/test_demo_archive.py (the
    command the demo prints); here, a source with no figure's data, and a missing one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "bare" / "job_id=j" / "epoch=1"
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"group_id": [1], "reward": [1.0]}), folder / "part-0.parquet")
    out = tmp_path / "cli.html"
    cmd = [sys.executable, "-m", "trajflight", "report", str(tmp_path / "bare"), "-o", str(out)]
    done = subprocess.run([*cmd, "--png", str(tmp_path / "p")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "(0 of 6 figures drawn)" in done.stdout
    assert "  staleness: no data: " in done.stdout
    _check_page(out.read_text(encoding="utf-8"), drawn=set())
    bad = subprocess.run(
        [sys.executable, "-m", "trajflight", "report", str(tmp_path / "nowhere")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2
    assert bad.stderr.startswith("trajflight report: no archive at")
