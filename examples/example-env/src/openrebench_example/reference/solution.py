"""Reference solution: a least-squares polynomial of degree 7 over the training points."""

import csv
from pathlib import Path

import numpy as np

_ROWS = list(csv.DictReader((Path(__file__).parent / "data" / "train.csv").open()))
_FIT = np.polynomial.Polynomial.fit([float(r["x"]) for r in _ROWS], [float(r["y"]) for r in _ROWS], deg=7)


def predict(xs: list[float]) -> list[float]:
    """One prediction of y for each x."""
    return [float(v) for v in _FIT(np.asarray(xs, dtype=float))]
