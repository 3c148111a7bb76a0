"""torchrun's environment as the tools read it (workshop_lib/debug/launchenv.py; the step scripts read theirs in view).

Kept from the old tests of ``workshop_lib.distributed``, whose reader moved to the debug layer.
"""

from __future__ import annotations

import pytest

from workshop_lib.debug.launchenv import read_launch_env
from workshop_lib.errors import WorkshopError


def test_plain_python_is_a_world_of_one():
    env = read_launch_env({})
    assert (env.rank, env.local_rank, env.world_size, env.under_torchrun) == (0, 0, 1, False)
    assert env.master_addr == "127.0.0.1"  # the rendezvous defaults to this machine


def test_torchrun_variables_are_read():
    env = read_launch_env({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
                           "MASTER_ADDR": "node0", "MASTER_PORT": "29400", "TORCHELASTIC_RESTART_COUNT": "1",
                           "TORCHELASTIC_RUN_ID": "x", "OMP_NUM_THREADS": "1"})
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (3, 1, 4, 2)
    assert (env.master_addr, env.master_port, env.restart_count, env.omp_threads) == ("node0", 29400, 1, 1)
    assert env.under_torchrun


def test_a_broken_environment_is_a_clear_error():
    with pytest.raises(WorkshopError, match="incomplete torchrun environment"):
        read_launch_env({"WORLD_SIZE": "2"})


def test_the_variables_the_tools_give_a_rank_read_back_as_torchrun_s():
    from workshop_lib.debug.launchenv import launch_variables

    variables = launch_variables(3, 4, 2, MASTER_PORT=29500)
    assert variables == {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
                         "MASTER_PORT": "29500"}
    env = read_launch_env(variables)
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (3, 1, 4, 2)
    assert launch_variables(1, 2)["LOCAL_RANK"] == "1" and launch_variables(1, 2)["GROUP_RANK"] == "0"  # one node
