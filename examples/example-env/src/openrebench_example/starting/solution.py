"""Starting solution: predict the mean of the training targets everywhere."""

import csv
from pathlib import Path

_ROWS = list(csv.DictReader((Path(__file__).parent / "data" / "train.csv").open()))
_MEAN = sum(float(r["y"]) for r in _ROWS) / len(_ROWS)


def predict(xs: list[float]) -> list[float]:
    """One prediction of y for each x."""
    return [_MEAN for _ in xs]
