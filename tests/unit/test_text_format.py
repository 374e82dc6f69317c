"""One way to write a duration, a byte count and a text table (plugins/module_utils/text_format.py), used by
the modules, the engine filters, the reboot action and the CLI alike."""

from __future__ import annotations

import pytest
from ansible_collections.sparkfleet.cluster.plugins.filter import engine
from ansible_collections.sparkfleet.cluster.plugins.module_utils import text_format, weights_progress


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0.0s"),
        (4.25, "4.2s"),
        (59.9, "59.9s"),
        (60, "1m00s"),
        (303, "5m03s"),
        (3720, "1h02m"),
        (-3, "0.0s"),
    ],
)
def test_duration(seconds, text):
    assert text_format.duration(seconds) == text


def test_minutes_and_sizes():
    assert [text_format.minutes(s) for s in (0, 59, 61, 725.5, "90", None, "x")] == [
        "0 min", "0 min", "1 min", "12 min", "1 min", "?", "?",
    ]  # fmt: skip
    assert [text_format.size(n) for n in (0, 999, 1000, 630_100_000, 4e12, 7e15)] == [
        "0 B", "999 B", "1.0 KB", "630.1 MB", "4.0 TB", "7000.0 TB",
    ]  # fmt: skip


def test_text_table():
    rows = [["spark1", 0, "active/running", True], ["spark2", None, "", False]]
    assert text_format.text_table(["NODE", "RANK", "UNIT", "OK"], rows) == [
        "NODE    RANK  UNIT            OK",
        "------  ----  --------------  ---",
        "spark1  0     active/running  yes",
        "spark2  -     -               no",
    ]


def test_every_user_writes_them_the_same_way():
    from sparkfleet import tables, text

    assert text.fmt_duration(303) == text_format.duration(303) and text.fmt_bytes(1e9) == "1.0 GB"
    assert weights_progress.human(630_100_000) == "630.1 MB" and weights_progress.duration(65) == "1m05s"
    columns = [["node", "NODE"], ["rank", "RANK"]]
    rows = [{"node": "spark1", "rank": 0}, {"node": "spark2"}]
    assert engine.FilterModule().filters()["status_table"](rows, columns) == tables.text_table(
        ["NODE", "RANK"], [["spark1", 0], ["spark2", None]]
    )
