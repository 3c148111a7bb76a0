"""torch's own bugs that the lesson names, reproduced: each test fails once a torch release no longer has the bug,
so that the text that cites it is mended then."""

from __future__ import annotations

import pytest

from tests.conftest import REPO
from tests.reliability import torchrun

DETAIL_REPRO = REPO / "tests" / "workers" / "detail_ddp_segfault.py"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ddp_under_detail_debug_segfaults_on_cpu():
    """Notebook 05, lab 3: "This lab's script gets no further than DDP(...) under DETAIL".

    Under INFO DDP is built and trains on CPU: lab 5's broken run sets it (hang_runs.DEBUG) and gets as far as DDP's
    error in its second step, in test_hangs_lab.py's test_the_unused_parameter_lab_fails_with_ddps_whole_error and in
    05's replay; a job of this script under INFO as well repeated that."""
    job = torchrun([DETAIL_REPRO], TORCH_DISTRIBUTED_DEBUG="DETAIL")
    rc = job.wait(timeout=90)
    assert rc != 0 and job.output.count("DDP built") == 0 and "SIGSEGV" in job.output, job.output[-3000:]
