"""Run the adversarial suite (tests/redteam) and tabulate each attack: caught, ATTACK WORKS or error.

    python benchmarks/redteam.py [-k EXPR]

Runs `pytest tests/redteam` in a subprocess with JUnit XML output; each test's environment and attack class
come from its `@pytest.mark.attack(env=..., cls=...)` marker (collected with a small plugin that writes
them to a JSON file), its name from the first line of its docstring. A failed assertion means the attack
works; an exception elsewhere is an error. Writes benchmarks/results/redteam.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "benchmarks" / "results" / "redteam.json"
PLUGIN = '''
import json, os
def pytest_collection_modifyitems(items):
    out = {}
    for item in items:
        mark = item.get_closest_marker("attack")
        doc = (getattr(item, "function", None).__doc__ or "").strip().splitlines()
        out[item.nodeid] = {"env": mark.kwargs.get("env") if mark else "?",
                            "cls": mark.kwargs.get("cls") if mark else "?",
                            "name": doc[0] if doc else item.name}
    with open(os.environ["REDTEAM_META"], "w") as f:
        json.dump(out, f)
'''


def _outcome(case: ET.Element) -> tuple[str, str]:
    for tag in ("failure", "error", "skipped"):
        node = case.find(tag)
        if node is not None:
            text = (node.get("message") or node.text or "").strip().splitlines()
            detail = text[0][:200] if text else ""
            if tag == "failure" and "AssertionError" in (node.get("message") or "") + (node.text or ""):
                return "ATTACK WORKS", detail
            return ("skipped" if tag == "skipped" else "error"), detail
    return "caught", ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default=None, help="pytest -k expression (a subset of the attacks)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "redteam_meta_plugin.py").write_text(PLUGIN)
        junit, meta = Path(tmp) / "junit.xml", Path(tmp) / "meta.json"
        env = {**os.environ, "REDTEAM_META": str(meta),
               "PYTHONPATH": os.pathsep.join([tmp, os.environ.get("PYTHONPATH", "")])}
        cmd = [sys.executable, "-m", "pytest", "tests/redteam", "-q", "-p", "redteam_meta_plugin",
               f"--junitxml={junit}", "-o", "junit_family=xunit2", *(["-k", args.k] if args.k else [])]
        started = time.monotonic()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.monotonic() - started
        if not junit.exists():
            tail = (proc.stdout + proc.stderr)[-3000:]
            sys.exit(f"pytest wrote no report (exit {proc.returncode}):\n{tail}")
        info = json.loads(meta.read_text()) if meta.exists() else {}
        rows = []
        for case in ET.parse(junit).getroot().iter("testcase"):
            path = case.get("classname", "").replace(".", "/")
            nodeid = f"{path}.py::{case.get('name')}"
            m = info.get(nodeid, {"env": "?", "cls": "?", "name": case.get("name")})
            outcome, detail = _outcome(case)
            seconds = round(float(case.get("time", 0)), 2)
            rows.append({"test": nodeid, "attack": m["name"], "environment": m["env"], "class": m["cls"],
                         "outcome": outcome, "seconds": seconds, "detail": detail})
    rows.sort(key=lambda r: (r["environment"], r["class"], r["attack"]))
    table = Table(title=f"Adversarial suite: {len(rows)} attacks in {wall:.0f} s")
    for col in ("attack", "environment", "class", "outcome", "seconds"):
        table.add_column(col, justify="right" if col == "seconds" else "left")
    styles = {"caught": "green", "ATTACK WORKS": "bold red", "error": "yellow", "skipped": "dim"}
    for r in rows:
        table.add_row(r["attack"], r["environment"], r["class"],
                      f"[{styles[r['outcome']]}]{r['outcome']}[/]", f"{r['seconds']:.1f}")
    Console().print(table)
    counts = {k: sum(r["outcome"] == k for r in rows) for k in styles}
    Console().print(", ".join(f"{k}: {v}" for k, v in counts.items()))
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    record = {"command": " ".join(["python", "benchmarks/redteam.py", *sys.argv[1:]]),
              "wall_s": round(wall, 1), "counts": counts, "attacks": rows}
    RESULT.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
