"""Run the adversarial suite (tests/redteam) and tabulate each attack: caught, ATTACK WORKS or error.

    python benchmarks/redteam.py [-k EXPR]             # every attack, with every defence
    python benchmarks/redteam.py --defences-off        # each switchable defence off in turn

Runs `pytest tests/redteam` in a subprocess with JUnit XML output; each test's environment, kind of attack
and invariant come from its `@pytest.mark.attack(env=..., cls=..., invariant=N)` marker (collected with a
small plugin that writes them to a JSON file), its name from the first line of its docstring. A failed
assertion means the attack works; an exception elsewhere is an error. Prints the attacks per invariant
(the threat model asks for at least 5 each). Writes benchmarks/results/redteam/<today>_all_attacks.json
(`--out` for another file).

`--defences-off` runs pytest once per defence of tests/redteam/defences.py with that defence switched off
(`--defences-off NAME`), only the attacks it stops: each must then work, which shows the attack is real.
Writes benchmarks/results/redteam/<today>_defences_off.json.
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
from datetime import date
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "redteam"
sys.path.insert(0, str(ROOT / "tests" / "redteam"))
from defences import SWITCHES  # noqa: E402

from conftest import INVARIANTS  # noqa: E402

PLUGIN = '''
import json, os
def pytest_collection_modifyitems(items):
    out = {}
    for item in items:
        mark = item.get_closest_marker("attack")
        doc = (getattr(item, "function", None).__doc__ or "").strip().splitlines()
        out[item.nodeid] = {"env": mark.kwargs.get("env") if mark else "?",
                            "cls": mark.kwargs.get("cls") if mark else "?",
                            "invariant": mark.kwargs.get("invariant") if mark else None,
                            "defence": next((m.kwargs["defence"] for m in item.iter_markers("attack")
                                             if m.kwargs.get("defence")), None),
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
            said = (node.get("message") or "") + (node.text or "")
            if tag == "failure" and ("AssertionError" in said or "attack works" in said):
                return "ATTACK WORKS", detail
            return ("skipped" if tag == "skipped" else "error"), detail
    return "caught", ""


def run_suite(k: str | None = None, defence: str | None = None) -> tuple[list[dict[str, Any]], float]:
    """One pytest run of tests/redteam (with `defence` switched off, if given): a row per attack."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "redteam_meta_plugin.py").write_text(PLUGIN)
        junit, meta = Path(tmp) / "junit.xml", Path(tmp) / "meta.json"
        env = {**os.environ, "REDTEAM_META": str(meta),
               "PYTHONPATH": os.pathsep.join([tmp, os.environ.get("PYTHONPATH", "")])}
        cmd = [sys.executable, "-m", "pytest", "tests/redteam", "-q", "-p", "redteam_meta_plugin",
               f"--junitxml={junit}", "-o", "junit_family=xunit2", *(["-k", k] if k else []),
               *(["--defences-off", defence] if defence else [])]
        started = time.monotonic()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        wall = time.monotonic() - started
        if not junit.exists():
            tail = (proc.stdout + proc.stderr)[-3000:]
            sys.exit(f"pytest wrote no report (exit {proc.returncode}):\n{tail}")
        info = json.loads(meta.read_text()) if meta.exists() else {}
        rows: list[dict[str, Any]] = []
        for case in ET.parse(junit).getroot().iter("testcase"):
            path = case.get("classname", "").replace(".", "/")
            nodeid = f"{path}.py::{case.get('name')}"
            m = info.get(nodeid, {"env": "?", "cls": "?", "name": case.get("name")})
            outcome, detail = _outcome(case)
            rows.append({"test": nodeid, "attack": m["name"], "environment": m["env"], "class": m["cls"],
                         "invariant": m.get("invariant"), "defence": m.get("defence"), "outcome": outcome,
                         "seconds": round(float(case.get("time", 0)), 2), "detail": detail})
    rows.sort(key=lambda r: (str(r["invariant"]), str(r["environment"]), str(r["class"]), str(r["attack"])))
    return rows, wall


STYLES = {"caught": "green", "ATTACK WORKS": "bold red", "error": "yellow", "skipped": "dim"}


def _table(title: str, rows: list[dict[str, Any]]) -> Table:
    table = Table(title=title)
    for col in ("invariant", "attack", "environment", "class", "outcome", "seconds"):
        table.add_column(col, justify="right" if col in ("seconds", "invariant") else "left")
    for r in rows:
        table.add_row(str(r["invariant"]), str(r["attack"]), str(r["environment"]), str(r["class"]),
                      f"[{STYLES[r['outcome']]}]{r['outcome']}[/]", f"{r['seconds']:.1f}")
    return table


def _per_invariant(rows: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for n, what in INVARIANTS.items():
        mine = [r for r in rows if r["invariant"] == n]
        tally = {k: sum(r["outcome"] == k for r in mine) for k in STYLES}
        out[f"{n}: {what}"] = {"attacks": len(mine), **tally}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", default=None, help="pytest -k expression (a subset of the attacks)")
    parser.add_argument("--defences-off", action="store_true",
                        help="switch each defence off in turn and run its attacks (they must work)")
    parser.add_argument("--out", type=Path, default=None,
                        help="results file (default: benchmarks/results/redteam/<today>_all_attacks.json, "
                             "or <today>_defences_off.json)")
    args = parser.parse_args()
    what = "defences_off" if args.defences_off else "all_attacks"
    out = args.out or RESULTS / f"{date.today().isoformat()}_{what}.json"
    console = Console()
    command = " ".join(["python", "benchmarks/redteam.py", *sys.argv[1:]])
    if args.defences_off:
        record: dict[str, Any] = {"command": command, "defences": {}}
        for name, switch in SWITCHES.items():
            rows, wall = run_suite(args.k, name)
            console.print(_table(f"Defence off: {name} ({switch.what}): {len(rows)} attacks in {wall:.0f} s",
                                 rows))
            works = sum(r["outcome"] == "ATTACK WORKS" for r in rows)
            console.print(f"{works} of {len(rows)} attacks work with it off")
            record["defences"][name] = {"what": switch.what, "wall_s": round(wall, 1), "attacks": len(rows),
                                        "work": works, "rows": rows}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=2) + "\n")
        console.print(f"results: {out}")
        return
    rows, wall = run_suite(args.k)
    console.print(_table(f"Adversarial suite: {len(rows)} attacks in {wall:.0f} s", rows))
    counts = {k: sum(r["outcome"] == k for r in rows) for k in STYLES}
    console.print(", ".join(f"{k}: {v}" for k, v in counts.items()))
    per = _per_invariant(rows)
    for what, c in per.items():
        console.print(f"invariant {what}: {c['attacks']} attacks, {c['caught']} caught"
                      + (f", [bold red]{c['ATTACK WORKS']} work[/]" if c["ATTACK WORKS"] else ""))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": command, "wall_s": round(wall, 1), "counts": counts,
                               "per_invariant": per, "attacks": rows}, indent=2) + "\n")
    console.print(f"results: {out}")


if __name__ == "__main__":
    main()
