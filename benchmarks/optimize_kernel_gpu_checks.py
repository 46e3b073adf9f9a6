"""optimize_kernel on a GPU: honest and hostile solutions scored through the real pipeline.

Each case is scored `--repeats` times (sandboxed wherever bubblewrap starts), interleaved: the start,
the reference, and attacks on the CUDA protocol (the reference with torch.cuda.synchronize patched
away; the same on a side stream, so that the host's completion event covers none of the work; a
solution returning its input). Prints per case the median time per call, the median window and the
wall time per scoring; then, from the start's and the reference's scorings, the calibration record
they make (`--record`: written there) and the reference's spread in normalised score, the precision
target (5% of its normalised value); writes everything as JSON.

    python benchmarks/optimize_kernel_gpu_checks.py --repeats 6 --record calibration.json \
        --out benchmarks/results/optimize_kernel_gpu_checks/$(date +%F)_full_h200.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from openrebench.runs import detect_hardware, get_environment, score_run, start_run

PATCH_SYNC = "import torch\ntorch.cuda.synchronize = lambda *a, **k: None\n"
SIDE_STREAM = """
_side = torch.cuda.Stream()


def prefix_sum(x):
    _side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(_side):
        return _reference(x)
"""


def cases(reference: str, start: str) -> dict[str, str]:
    head, sep, rest = reference.partition("from __future__ import annotations\n")
    patched = head + sep + PATCH_SYNC + rest
    side = patched.replace("def prefix_sum(", "def _reference(") + SIDE_STREAM
    return {"start": start, "reference": reference, "reference, synchronize patched away": patched,
            "reference on a side stream, synchronize patched away": side,
            "returns its input": "def prefix_sum(x):\n    return x\n"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--record", type=Path, help="write the calibration record the start's and the "
                                                    "reference's scorings make here")
    args = parser.parse_args()
    env = get_environment("optimize_kernel")
    root = env.root
    codes = cases((root / "reference" / "solution.py").read_text(),
                  (root / "starting" / "solution.py").read_text())
    rows: dict[str, list[dict[str, object]]] = {name: [] for name in codes}
    with tempfile.TemporaryDirectory() as tmp:
        run, _ = start_run("optimize_kernel", "full", Path(tmp) / "run", score_start=False)
        for i in range(args.repeats):
            for name, code in codes.items():
                (run.workspace / "solution.py").write_text(code)
                t0 = time.perf_counter()
                row = score_run(run, kind="calibration", charged=False)
                d = row.details
                window = statistics.median(d["windows_ms"]) if d.get("windows_ms") else None
                rows[name].append({"raw": row.raw, "median_ms": d.get("median_ms"), "window_ms": window,
                                   "overhead_ms": d.get("overhead_ms"), "wall_s": time.perf_counter() - t0,
                                   "message": row.message, "phases_s": d.get("phases_s"),
                                   "harness_phases_s": d.get("harness_phases_s")})
                print(f"#{i + 1} {name}: {row.message[:300]}", flush=True)
                if "infrastructure failure" in row.message:
                    # Not the solution's doing: stop here (device time is dear), with what the scorer said.
                    print(str(d.get("scorer_stderr", ""))[-3000:], file=sys.stderr)
                    raise SystemExit(f"stopped: the pipeline failed on this machine ({name})")
    print(f"\n{'case':<55}{'valid':>6}{'ms':>9}{'window':>9}{'overhead':>10}{'wall s':>8}")
    summary = {}
    for name, rs in rows.items():
        valid = [r for r in rs if r["raw"] is not None]

        def med(key: str, rs: list[dict[str, object]] = valid) -> float | None:
            return statistics.median(float(r[key]) for r in rs) if rs else None  # type: ignore[arg-type]

        summary[name] = {"valid": len(valid), "scorings": len(rs), "median_ms": med("median_ms"),
                         "window_ms": med("window_ms"), "overhead_ms": med("overhead_ms"),
                         "wall_s": med("wall_s", rs)}
        for key in ("phases_s", "harness_phases_s"):
            phases = [r[key] for r in rs if isinstance(r.get(key), dict)]
            summary[name][key] = {k: statistics.median(ph.get(k, 0.0) for ph in phases)  # type: ignore[union-attr]
                                  for k in (phases[0] if phases else {})}
        s = summary[name]
        fmt = lambda v: "—" if v is None else f"{v:.3f}"  # noqa: E731
        print(f"{name:<55}{s['valid']:>3}/{len(rs):<2}{fmt(s['median_ms']):>9}{fmt(s['window_ms']):>9}"
              f"{fmt(s['overhead_ms']):>10}{s['wall_s']:>8.1f}")
    print("\nmedian seconds per phase of a scoring (inside the scorer; then the harness's: the snapshot, "
          "the sandbox's set-up, the scorer process's start, its environment's loading, its scoring with "
          "imports, its exit):")
    for name, s in summary.items():
        print(f"{name:<55}" + "  ".join(f"{k} {v:.2f}" for k, v in s["phases_s"].items()))
        print(f"{'':<55}" + "  ".join(f"{k} {v:.2f}" for k, v in s["harness_phases_s"].items()))
    precision = _precision(env, rows, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"command": " ".join(["python", *sys.argv]), "repeats": args.repeats,
                                    "hardware": detect_hardware().model_dump(), "summary": summary,
                                    "precision": precision, "scorings": rows}, indent=2) + "\n")
    print(f"results: {args.out}")


def _precision(env: object, rows: dict[str, list[dict[str, object]]], args: argparse.Namespace) -> dict:
    """The record the start's and reference's scorings make, and the reference's normalised spread."""
    from openrebench.runs._calibration import record_of_scorings

    raws = {which: [float(r["raw"]) for r in rows[which] if r["raw"] is not None]  # type: ignore[arg-type]
            for which in ("start", "reference")}
    record = record_of_scorings(env, "full", rows, command=" ".join(["python", *sys.argv]))  # type: ignore[arg-type]
    if args.record is not None:
        args.record.write_text(record.model_dump_json(indent=2) + "\n")
    start, ref = record.start.median, record.reference.median
    normalised = [(start - r) / (start - ref) for r in raws["reference"]]
    spread = {"normalised": normalised, "sd": statistics.pstdev(normalised),
              "range": max(normalised) - min(normalised), "target_sd": 0.05}
    print(f"record: start {start:.4f} (ln ms), reference {ref:.4f}; the reference normalises to "
          f"{min(normalised):.3f}-{max(normalised):.3f} (SD {spread['sd']:.4f}; target at most 0.05)")
    return {"record": record.model_dump(mode="json"), "reference_spread": spread}


if __name__ == "__main__":
    main()
