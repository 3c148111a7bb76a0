"""Notebook 06's exercises: each classic mistake is named in one line.

That each solution passes its check is notebook 06's own replay (nbval): its cells nb06-ex1-check, nb06-ex2-check and
nb06-ex4-check run check.compiled_ddp, check.fsdp and check.resume on the solutions and compare the ✓ lines with the
stored ones; a run of the same solutions here repeated them.
"""

from __future__ import annotations

import re
import time

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from workshop_lib.checks import beyond
from workshop_lib.engine.common import CheckFailed

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def compile_wrapper(model, backend, bucket_cap_mb):
    return torch.compile(DDP(model, bucket_cap_mb=bucket_cap_mb), backend=backend)


def shard_blocks(model, mesh):
    from torch.distributed.fsdp import fully_shard

    for block in (model.forward_lstm, model.backward_lstm, model.head):
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


def make_evaluate(everyone=True, gather=True):
    def evaluate_and_save(model, tokens, lengths, path):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        logits = None
        if everyone or dist.get_rank() == 0:
            with torch.no_grad():
                logits = model(tokens, lengths)
        state = (get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
                 if gather else model.state_dict())
        if dist.get_rank() == 0:
            torch.save(state, path)
        return logits
    return evaluate_and_save


def gather_on_rank0(model, tokens, lengths, path):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    with torch.no_grad():
        logits = model(tokens, lengths)  # every rank
    if dist.get_rank() == 0:
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        torch.save(state, path)
    return logits


def test_a_full_state_gather_on_rank_0_alone_names_its_line_and_the_condition():
    import inspect

    first = inspect.getsourcelines(gather_on_rank0)[1]
    with pytest.raises(CheckFailed, match=re.escape(
            f"get_model_state_dict (line {first + 6}) is called by rank 0 alone, under `if dist.get_rank() == 0:` (line "
            f"{first + 5}): call it on every rank (it is a collective), or move it out of the block")) as err:
        beyond.fsdp(shard_blocks, gather_on_rank0)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("predicted", "said"), [
    (0.5, "\N{CHECK MARK} FSDP2's share of DDP's bytes per rank: you predicted 50%, measured 50%; each of N ranks"),
    (0.42, "\N{CHECK MARK} FSDP2's share of DDP's bytes per rank: you predicted 42%, measured 50%"),
    (1.0, "\N{BALLOT X} FSDP2's share of DDP's bytes per rank: you predicted 100%, measured 50%"),
    (50, "\N{CHECK MARK} FSDP2's share of DDP's bytes per rank: you predicted 50%, measured 50%"),  # a percent
    (1.35, "\N{BALLOT X} FSDP2's share of DDP's bytes per rank: you predicted 1%, measured 50%"),  # 1.35%
    (None, "\N{BALLOT X} FSDP2's share of DDP's bytes per rank: no prediction, measured 50%"),
])
def test_the_share_prediction_is_judged_never_raised(predicted, said, capsys):
    beyond.share_prediction(predicted, 0.5)
    assert capsys.readouterr().out.startswith(said)


def make_resume(optimizer_too=True, uses_rank=False):
    def resume(path):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        from workshop_lib.model import SmilesLSTM

        if uses_rank:
            print(dist.get_rank())
        torch.manual_seed(1)
        model = SmilesLSTM(12, 8, 8, 1, 0.0)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        model_state, optim_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optim": optim_state} if optimizer_too else {"model": model_state}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"] if optimizer_too else optimizer.state_dict())
        return model, optimizer
    return resume


@pytest.mark.parametrize(("fn", "line"), [
    (compile_wrapper, "you compiled the DDP wrapper"),
])
def test_compile_mistakes_named(fn, line):
    with pytest.raises(CheckFailed, match=line):
        beyond.compiled_ddp(fn)


@pytest.mark.parametrize(("shard", "evaluate", "line"), [
    (shard_blocks, make_evaluate(everyone=False), "not on rank 0 alone"),
    (shard_blocks, make_evaluate(gather=False), "the file holds DTensors"),
])
def test_fsdp_mistakes_named(shard, evaluate, line):
    start = time.monotonic()
    with pytest.raises(CheckFailed, match=line):
        beyond.fsdp(shard, evaluate)
    assert time.monotonic() - start < 30  # rank 0 alone in a collective ends in bounded time


class Unreadable(torch.optim.AdamW):
    def state_dict(self):
        raise RuntimeError("the optimizer's state was read")


def resume_into_a_wrapper(path):
    """Its keys differ: named before the weights are read by key or the optimizer's state is read (it cannot be)."""
    from workshop_lib.model import SmilesLSTM

    wrapper = torch.nn.ModuleDict({"inner": SmilesLSTM(12, 8, 8, 1, 0.0)})
    return wrapper, Unreadable(wrapper.parameters())


@pytest.mark.parametrize(("fn", "line"), [
    (make_resume(optimizer_too=False), "the optimizer's state does not"),
    (make_resume(uses_rank=True), r"^resume raised ValueError \(line \d+\): Default process group has not been "
                                  r"initialized.*; resume runs in this one process, which joined no process group: "
                                  r"leave the dist calls out of it$"),
    (resume_into_a_wrapper, r"^the model's keys \(inner\.\S+, \.\.\.\) are not the saved ones \((?!inner)\S+, "
                            r"\.\.\.\): resume into the plain model, no wrapper$"),
])
def test_resume_mistakes_named(fn, line):
    with pytest.raises(CheckFailed, match=line):
        beyond.resume(fn)

