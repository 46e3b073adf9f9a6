"""The score metadata's one definition: what the harness writes is what the CLI, the analysis and the
cluster read, logs from other versions included."""

from __future__ import annotations

import pytest

from openrebench.base import OpenRebenchError
from openrebench.runs import ScoreMetadata


def test_only_the_fields_set_are_written_and_read_back_the_same() -> None:
    meta = ScoreMetadata(raw=None, run_dir="/runs/a", fingerprint={"constants": {"source": "shipped record"}},
                         score_log=[{"kind": "setup"}], log_warnings=[])
    meta.normalised_paper = 0.25  # set after: written too
    written = meta.written()
    assert written == {"raw": None, "run_dir": "/runs/a",
                       "fingerprint": {"constants": {"source": "shipped record"}},
                       "score_log": [{"kind": "setup"}], "log_warnings": [], "normalised_paper": 0.25}
    again = ScoreMetadata.read(written)
    assert again == meta and again.constants_source == "shipped record" and again.gateway_usage is None


def test_an_older_or_newer_log_reads_with_defaults_and_keeps_unknown_keys() -> None:
    old = ScoreMetadata.read({"raw": 1.5})  # no fingerprint, no rows: an early version's log
    assert old.score_log == [] and old.isolated is None and old.constants_source is None
    new = ScoreMetadata.read({"raw": 1.5, "added_later": {"x": 1}})
    assert new.written() == {"raw": 1.5, "added_later": {"x": 1}}


MALFORMED = [({"raw": "fast"}, "'raw' is not a number"),
             ({"score_log": {"a": 1}}, "'score_log' is not a list of rows"),
             ({"isolated": "maybe"}, "'isolated' is not true or false")]


@pytest.mark.parametrize(("metadata", "said"), MALFORMED)
def test_a_malformed_field_is_one_line_naming_it(metadata: dict, said: str) -> None:
    with pytest.raises(OpenRebenchError, match=rf"^logs/x.eval: score metadata {said}$") as e:
        ScoreMetadata.read(metadata, "logs/x.eval")
    assert "\n" not in str(e.value)
