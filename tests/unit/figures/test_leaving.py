"""workshop_lib.figures.leaving: with Gloo a waiting rank is released when the failed rank's connections close."""

from __future__ import annotations

import pytest

from workshop_lib.figures import leaving


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_waiting_rank_is_released_by_leaving_or_by_the_end_of_the_process(capsys):
    leaving.demo(linger=1.0)  # asserts the order of the events itself
    assert capsys.readouterr().out.splitlines()[-2:] == [
        "rank 1 failed and left the group in its finally, then lived on: rank 0's all_reduce failed while rank 1 "
        "still ran (gloo: its connection to rank 1 was closed)",
        "rank 1 failed and lived on without leaving, then ended: rank 0's all_reduce failed only when rank 1's "
        "process ended (gloo: its connection to rank 1 was closed)"]
