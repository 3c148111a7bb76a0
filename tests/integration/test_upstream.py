"""torch's own bugs that the lesson names, reproduced: each test fails once a torch release no longer has the bug,
so that the text that cites it is mended then."""

from __future__ import annotations

import pytest

from tests.conftest import REPO
from tests.reliability import torchrun

DETAIL_REPRO = REPO / "tests" / "workers" / "detail_ddp_segfault.py"


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize(("level", "crashes"), [("DETAIL", True), ("INFO", False)])
def test_ddp_under_detail_debug_segfaults_on_cpu_and_under_info_it_does_not(level, crashes):
    """Notebook 05, lab 3: "This lab's script gets no further than DDP(...) under DETAIL"."""
    job = torchrun([DETAIL_REPRO], TORCH_DISTRIBUTED_DEBUG=level)
    rc = job.wait(timeout=90)
    built = job.output.count("DDP built")
    if crashes:
        assert rc != 0 and built == 0 and "SIGSEGV" in job.output, job.output[-3000:]
    else:
        assert rc == 0 and built == 2, job.output[-3000:]
