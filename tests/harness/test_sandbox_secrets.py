"""Nothing secret is readable in the agent's sandbox: every file it can read under the Python
environment (the venv, where the package's metadata lives) and the package is searched for the
reference solutions' descriptions and code, held-out problem generators, ground truths, the experiments
behind shipped reference answers and calibration results."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

import openrebench
from openrebench.harness import OpenRebenchSandbox, SandboxConfig
from openrebench.isolation import bwrap_binary
from openrebench.isolation._bwrap import package_root
from openrebench.runs import start_run

pytestmark = pytest.mark.skipif(bwrap_binary() is None, reason="bubblewrap is not available")

PACKAGE = Path(openrebench.__file__).resolve().parent
REPO = PACKAGE.parent.parent
# How the project's documentation describes the reference solutions and their results (one line each).
DESCRIPTIONS = ["a linear map from the small model's embeddings into the large model's space",
                "The reference follows the paper's: a residual stack of convolutions",
                "runs an IsoFLOP grid under the cap", "computes the same in one process",
                "n_embd 128–160 (held-out loss 2.345)"]

SEARCH = r"""
import json, os, re, stat, sys
markers = json.load(open(sys.argv[1]))
phrases = [m.encode() for m in markers["phrases"]]
lines = {m.encode() for m in markers["lines"]}
numbers = {m.encode() for m in markers["numbers"]}
# Numbers of 6 or more decimals (-?\d+\.\d{6,}, an exponent optional), found from their decimal point and
# widened back over their integer digits: 37 times faster than that pattern's findall over the venv.
fraction = re.compile(rb"\.\d{6,}(?:e-?\d+)?")


def numbers_in(data):
    out = set()
    for m in fraction.finditer(data):
        start = m.start()
        while start > 0 and 48 <= data[start - 1] <= 57:
            start -= 1
        if start < m.start():
            out.add(data[start - (start > 0 and data[start - 1] == 45):m.end()])
    return out


hits, files, unreadable = [], 0, 0
for root in sys.argv[2:]:
    for folder, dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(folder, name)
            if name.startswith(("heldout", "ground_truth--")) or (
                    "openrebench" in folder and os.path.basename(folder) == "calibration"):
                hits.append([path, "a protected file by its name"])
            # compiled bytecode holds its source's strings: the source beside it is searched
            if name.endswith(".pyc") and os.path.basename(folder) == "__pycache__" and os.path.exists(
                    os.path.join(os.path.dirname(folder), name.split(".")[0] + ".py")):
                continue
            try:
                if not stat.S_ISREG(os.stat(path, follow_symlinks=False).st_mode):
                    continue
                with open(path, "rb") as f:
                    data = f.read()
            except OSError:
                unreadable += 1
                continue
            files += 1
            found = [m for m in phrases if m in data]
            if b"\0" not in data[:65536]:  # text: code lines and numbers too (binaries hold neither)
                found += list(numbers_in(data) & numbers)
                found += list({x.strip() for x in data.splitlines()} & lines)
            hits += [[path, m.decode(errors="replace")] for m in found]
print(json.dumps({"hits": hits, "files": files, "unreadable": unreadable}))
"""


def _markers() -> dict[str, list[str]]:
    """Descriptions of the references, lines of their code and of held-out generators (statements
    included) found nowhere else in the package, and the exact values of ground truths and calibration
    records (their reprs, as any copy would write them)."""
    lines, numbers = [], []
    elsewhere = "\n".join(p.read_text(errors="replace") for p in PACKAGE.rglob("*.py")
                          if not {"reference", "heldout"} & set(p.parts))
    for env in sorted(PACKAGE.glob("environments/*")):
        for ref in sorted([*(env / "reference").glob("*.py"), *(env / "heldout").glob("*.py")]):
            stripped = [x.strip() for x in ref.read_text().splitlines()]
            lines += [x for x in stripped
                      if len(x) > 40 and not x.startswith(("#", '"', "'", "from ", "import "))
                      and x not in elsewhere]
        for truth in (env / "reference").glob("ground_truth--*.json"):
            numbers += [repr(p["loss"]) for p in json.loads(truth.read_text())["points"]]
        for answer in (env / "reference").glob("answer--*.json"):  # the reference's experiments
            numbers += [repr(g["loss"]) for g in json.loads(answer.read_text())["fit"]["grid"]]
        for record in (env / "calibration").glob("*.json"):
            data = json.loads(record.read_text())
            numbers += [repr(v) for which in ("start", "reference") for v in data[which]["values"]]
        if (env / "reference" / "constants.json").is_file():
            constants = json.loads((env / "reference" / "constants.json").read_text())
            numbers += [repr(c["start"]) for c in constants.values()]
    return {"phrases": DESCRIPTIONS, "lines": sorted(set(lines)),
            "numbers": sorted({n for n in numbers if _significant_digits(n) >= 8})}


def _significant_digits(number: str) -> int:
    """A number that says where it came from has many digits: chat_rl's win rates are multiples of 1/512,
    and one such short value (0.390625) is also in transformers' own sources."""
    return len(number.lstrip("-").replace(".", "").lstrip("0").split("e")[0])


def test_no_file_readable_in_the_agents_sandbox_holds_secrets(tmp_path: Path) -> None:
    markers = _markers()
    assert len(markers["lines"]) > 20 and len(markers["numbers"]) > 30
    # the markers do find the secrets where they are (the test can fail)
    for secret, kind in (("environments/fix_embedding/reference/fix.py", "lines"),
                         ("environments/rust_codecontests/heldout/families.py", "lines"),
                         ("environments/scaling_law/reference/constants.json", "numbers")):
        assert any(m in (PACKAGE / secret).read_text() for m in markers[kind]), secret
    docs = " ".join(p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))])
    assert all(m in " ".join(docs.split()) for m in DESCRIPTIONS)

    run = start_run("optimize_kernel", "mini", tmp_path / "run", score_start=False)[0]
    (run.workspace / "markers.json").write_text(json.dumps(markers))
    (run.workspace / "search.py").write_text(SEARCH)

    async def search() -> str:
        config = SandboxConfig(env_id="optimize_kernel", isolation="bwrap")
        box = await OpenRebenchSandbox.for_run(run, config)
        try:
            result = await box.exec(["python", "search.py", "markers.json", sys.prefix, str(package_root())],
                                    timeout=600)
        finally:
            await box.close()
        assert result.success, result.stderr
        return result.stdout

    found = json.loads(asyncio.run(search()))
    assert found["files"] > 1000  # it did read the environment
    assert found["hits"] == [], found["hits"][:20]


def test_the_references_settings_are_kept_with_the_reference() -> None:
    """Settings that describe how a reference works live in its masked reference/ folder, not in env.py."""
    from openrebench.runs import get_environment

    outside = [p for p in PACKAGE.rglob("*") if p.is_file() and p.suffix in (".py", ".md", ".json")
               and "reference" not in p.relative_to(PACKAGE).parts]
    text = "\n".join(p.read_text(errors="replace") for p in outside)
    for word in ("bigram", "map_steps", "tune_steps"):
        assert word not in text, word
    assert get_environment("restricted_mlm").tier("mini").params.train_reference["bigrams"] is True
    assert get_environment("fix_embedding").tier("mini").params.reference["map_steps"] > 0
