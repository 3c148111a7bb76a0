"""Two nodes on one machine: two torchrun agents meet at a c10d rendezvous on 127.0.0.1."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import REPO
from tests.reliability import RUN, STEP4, Launch, listening_port, reference_metrics, same_results, stop
from workshop_lib.launching.launch import torchrun_argv

FAULT_WORKER = REPO / "tests" / "workers" / "fault_worker.py"


def nodes(args: list, run_id: str, head_args: tuple = (), other_args: tuple = ()) -> list[Launch]:
    """What each node of a cluster runs, here twice on localhost (the agents find each other by run_id).

    The first node starts alone until it hosts the rendezvous store, as the head node of a cluster would;
    its store binds port 0, and the second node is given the port it took.
    """
    script, *rest = args

    def node(endpoint: str, more: tuple) -> Launch:
        return Launch(torchrun_argv(script, 1, standalone=False, nnodes=2, rdzv=("c10d", endpoint, run_id),
                                    args=[*rest, *more]))

    head = node("127.0.0.1:0", head_args)
    assert head.wait_for(lambda: listening_port(head.proc.pid) is not None, 60), head.output[-3000:]
    return [head, node(f"127.0.0.1:{listening_port(head.proc.pid)}", other_args)]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_nodes_train_like_one_node_with_two_processes(tmp_path):
    """Step 4, the script notebook 04a runs on two nodes: its snapshot lines work across nodes too."""
    launches = nodes([STEP4, *RUN, "--out", tmp_path], "workshop-multinode")
    try:
        codes = [launch.wait(timeout=180) for launch in launches]
    finally:
        for launch in launches:
            stop(launch)
    output = "\n".join(launch.output for launch in launches)
    assert codes == [0, 0], output[-3000:]
    assert output.count("metrics:") == 1 and "global batch 16" in output  # one global rank 0, two ranks
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["world_size"] == 2
    same_results(metrics, reference_metrics())


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_rank_failing_on_the_other_node_is_named_and_the_rest_exit_in_time():
    """No shared agent: the survivor's collective fails at once (gloo), and each node's torchrun names its own rank.

    The failed rank's node shows its traceback in its failure summary (``@record`` writes it to torchrun's error file,
    as on one node: this is the suite's run of a rank that raises); the survivor's shows gloo's "Connection closed by
    peer" (or "reset"), long before its --timeout.
    """
    timeout = 60
    # The rank on the second node fails; the first node, which hosts the rendezvous store, survives it.
    launches = nodes([FAULT_WORKER, "raise", timeout], "workshop-multinode-fault",
                     head_args=("survive",), other_args=("fail",))
    try:
        assert launches[0].wait_for(lambda: "fails now" in launches[1].output, 90), launches[1].output[-3000:]
        codes = [launch.wait(timeout=timeout / 2) for launch in launches]  # well before the survivor's timeout
    finally:
        for launch in launches:
            stop(launch)
    output = "\n".join(launch.output for launch in launches)
    assert all(code != 0 for code in codes), output[-3000:]
    assert "Timed out" not in output
    failed = re.search(r"rank (\d) fails now", launches[1].output).group(1)
    summary = launches[1].output.rsplit("ChildFailedError", 1)[1]
    failure = summary.split(f"rank      : {failed} (local_rank: 0)", 1)[1].split("-----")[0]  # its entry
    assert f"RuntimeError: rank {failed} raised on purpose" in failure and "fault_worker.py" in failure, summary
    assert re.search(r"Connection (closed|reset) by peer", launches[0].output), launches[0].output[-3000:]
