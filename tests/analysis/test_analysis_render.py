"""The HTML report in a real browser: headless Chromium loads it, every figure decodes, the page is not
blank."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread
from typer.testing import CliRunner

from analysis_helpers import REAL_LOG, react_log
from openrebench.cli import app

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason=(
    "Chromium is not installed (on Debian: apt-get install chromium; `make test` installs it where it can)"))

# Appended to a copy of the page: after load, count images that did not decode into a marker element.
PROBE = """<script>window.addEventListener('load', function () {
  var imgs = Array.from(document.images);
  var broken = imgs.filter(function (i) {
    return !(i.complete && i.naturalWidth > 0 && i.naturalHeight > 0);
  });
  var out = document.createElement('pre'); out.id = 'render-check';
  out.textContent = 'IMAGES ' + imgs.length + ' BROKEN ' + broken.length + ' WIDTHS ' +
    imgs.map(function (i) { return i.naturalWidth; }).join(',') + ' SHOWN ' +
    imgs.map(function (i) { return i.getBoundingClientRect().width.toFixed(0); }).join(',');
  document.body.appendChild(out);
});</script>"""


def _chromium(*args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--hide-scrollbars", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("render")
    runs = react_log(tmp / "react.eval")
    out = tmp / "report.html"
    result = CliRunner().invoke(app, ["report", str(REAL_LOG), str(runs), "--paper", "--out", str(out),
                                      "--boots", "200", "--sims", "400"])
    assert result.exit_code == 0, result.output
    return out


def test_every_figure_loads_in_chromium_at_about_its_own_size(report: Path) -> None:
    expected = len(re.findall(r"<img ", report.read_text()))
    assert expected == 6
    probe = report.with_name("probe.html")
    probe.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
    result = _chromium("--window-size=1280,2000", "--virtual-time-budget=10000", "--dump-dom", probe.as_uri())
    match = re.search(r"IMAGES (\d+) BROKEN (\d+) WIDTHS ([\d,]+) SHOWN ([\d,]+)", result.stdout)
    assert match, f"no render check in Chromium's DOM (exit {result.returncode}): {result.stderr[-800:]}"
    assert int(match.group(1)) == expected and int(match.group(2)) == 0
    natural = [int(w) for w in match.group(3).split(",")]
    shown = [int(w) for w in match.group(4).split(",")]
    assert all(w > 300 for w in natural)
    # Shown at no less than 85% of their pixels: the figures' 10-11 point text stays at 12 px or more.
    assert all(s >= 0.85 * n for s, n in zip(shown, natural, strict=True)), (natural, shown)


def test_screenshot_is_not_blank(report: Path) -> None:
    shot = report.with_name("shot.png")
    # Tall enough to reach the figures below the claims and data-treatment tables.
    result = _chromium("--window-size=1280,9000", f"--screenshot={shot}", report.as_uri())
    assert shot.exists(), f"Chromium wrote no screenshot (exit {result.returncode}): {result.stderr[-800:]}"
    pixels = imread(shot)[..., :3]
    assert pixels.shape[0] >= 8000 and pixels.shape[1] >= 1200
    not_white = (pixels < 0.9).any(axis=2).mean()
    colourful = (np.ptp(pixels, axis=2) > 0.25).mean()  # coloured plot lines, not only black text
    assert not_white > 0.02 and colourful > 0.001, (not_white, colourful)
