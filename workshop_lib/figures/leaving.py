"""What frees a rank that waits in a collective when another rank fails: :func:`demo` on two Gloo ranks (01).

Rank 1 fails (an error it catches), once leaving the group in its ``finally`` and living on, once living on
without leaving; rank 0 waits in an all_reduce it never joins. With Gloo, rank 0 is released when rank 1's
connections close.
"""

from __future__ import annotations

LINGER = 1.0  # seconds rank 1 lives on after its failure (a waiting rank notices a closed socket well within it)


def _rank(env, leave: bool, linger: float) -> dict:
    import time

    import torch
    import torch.distributed as dist

    dist.barrier()  # both ranks in the group: init returns on one rank before the other has finished connecting
    if env.rank == 1:
        try:
            raise RuntimeError("a bug in rank 1's training")
        except RuntimeError:
            pass
        finally:
            if leave:
                dist.destroy_process_group()
        time.sleep(linger)
        return {"ended": time.monotonic()}  # the launcher's teardown closes whatever is still open, right after
    try:
        dist.all_reduce(torch.ones(1))
        error = ""
    except RuntimeError as err:
        error = str(err)
    return {"released": time.monotonic(), "error": error}


def demo(linger: float = LINGER) -> None:
    """Run both cases; print how rank 0 was released in each (forked ranks, a few seconds)."""
    from workshop_lib.launching.forklaunch import notebook_launch

    for leave in (True, False):
        waiting, failed = notebook_launch(_rank, 2, leave, linger)
        assert waiting["error"], "rank 0's all_reduce returned without rank 1"
        closed = any(s in waiting["error"] for s in ("closed by peer", "reset by peer"))  # gloo says either
        why = "gloo: its connection to rank 1 was closed" if closed else waiting["error"][:80]
        early = waiting["released"] < failed["ended"]
        assert early == leave, f"rank 0 was released {'before' if early else 'after'} rank 1 ended (leave={leave})"
        how = ("left the group in its finally, then lived on" if leave else "lived on without leaving, then ended")
        when = "while rank 1 still ran" if early else "only when rank 1's process ended"
        print(f"rank 1 failed and {how}: rank 0's all_reduce failed {when} ({why})")
