"""torch's own errors, raised by torch itself, each explained by the one table (so a release that rewords one shows)."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from workshop_lib.engine.common import CheckFailed, run_forked
from workshop_lib.engine.torch_errors import explain, set_up_by


@pytest.fixture
def world_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=30))
    yield
    dist.destroy_process_group()


class _TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.used, self.unused = nn.Linear(3, 1), nn.Linear(3, 1)

    def forward(self, x):
        return self.used(x)


def _unused_parameter():
    model = DDP(_TwoHeads())
    for _ in range(2):
        model(torch.ones(2, 3)).sum().backward()


CASES = {
    "module": (lambda: nn.Linear(3, 1).module, "`.module` is the model inside DDP's wrapper"),
    "timeout": (lambda: dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=5.0),
                "timeout=timedelta(seconds=...)"),
    "shuffle": (lambda: DataLoader(list(range(8)), sampler=DistributedSampler(list(range(8)), 1, 0), shuffle=True),
                "leave shuffle out of the DataLoader"),
    "not joined": (lambda: dist.get_rank(), "call dist.init_process_group(backend) first"),
    "set_epoch of a loader's own sampler": (lambda: DataLoader(list(range(8)), shuffle=True).sampler.set_epoch(1),
                                            "sampler=DistributedSampler(dataset)"),
    "device_id on CPU": (lambda: dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                                                         device_id=torch.device("cpu")),
                         "pass device_id only on a GPU"),
    "items of different lengths, no collate_fn": (lambda: next(iter(DataLoader([torch.ones(3), torch.ones(2)],
                                                                               batch_size=2))),
                                                  "give it collate_fn=, a function that pads each batch"),
}
JOINED = {
    "saved from the wrapper": (lambda: nn.Linear(3, 1).load_state_dict(DDP(nn.Linear(3, 1)).state_dict()),
                               "save model.module.state_dict()"),
    "loaded into the wrapper": (lambda: DDP(nn.Linear(3, 1)).load_state_dict(nn.Linear(3, 1).state_dict()),
                                "load into model.module"),
    "unused parameter": (_unused_parameter, "find_unused_parameters=True"),
    "device_ids on CPU": (lambda: DDP(nn.Linear(3, 1), device_ids=[0]), "give DDP no device_ids on CPU"),
}


def _raised(fn) -> str:
    with pytest.raises(Exception) as err:  # torch's own type, whichever it is
        fn()
    return str(err.value)


@pytest.mark.parametrize("case", CASES)
def test_each_error_torch_raises_for_a_mistake_is_explained(case):
    fn, says = CASES[case]
    assert says in (explain(_raised(fn)) or ""), _raised(fn)


@pytest.mark.skipif(not torch.backends.cuda.is_built(), reason="a CPU build has no CUDA to start in a forked child")
def test_a_cuda_call_in_a_rank_forked_after_cuda_was_tried_is_explained():
    """A CUDA build: once the parent started CUDA, or tried to (without a GPU: it failed), a forked child cannot start
    it. In a subprocess of its own, so that this test's process stays free to fork."""
    code = ("import os, torch\n"
            "try:\n    torch.zeros(1, device='cuda')\nexcept Exception:\n    pass\n"
            "r, w = os.pipe()\n"
            "if os.fork() == 0:\n"
            "    try:\n        torch.cuda.set_device(0)\n    except Exception as err:\n"
            "        os.write(w, str(err).encode())\n    os._exit(0)\n"
            "os.close(w); os.wait(); print(os.read(r, 4096).decode())\n")
    said = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert "Cannot re-initialize CUDA in forked subprocess" in said, said
    assert "cannot start again in a forked child: call CUDA only where torch.cuda.is_available()" in explain(said)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the errors of a machine without a GPU")
@pytest.mark.parametrize("call", [lambda: torch.cuda.set_device(1), lambda: torch.zeros(1, device="cuda")],
                         ids=["set_device", "a tensor"])
def test_a_cuda_call_without_a_gpu_is_explained(call):
    assert "this machine has no GPU: call CUDA only where torch.cuda.is_available()" in (explain(_raised(call)) or "")


@pytest.mark.parametrize("case", JOINED)
def test_each_error_torch_raises_in_a_group_is_explained(case, world_of_one):
    fn, says = JOINED[case]
    assert says in (explain(_raised(fn)) or ""), _raised(fn)


def test_the_collate_error_is_set_up_by_the_loader_and_the_others_where_they_raise():
    assert set_up_by(_raised(CASES["items of different lengths, no collate_fn"][0])) == "loader"
    assert set_up_by(_raised(CASES["device_id on CPU"][0])) is None


def test_an_error_of_another_kind_is_left_to_torchs_words():
    assert explain("CUDA out of memory. Tried to allocate 2.00 GiB") is None
    # a name left None (set under a rank test) is not a model never wrapped: branches.unset_on_rank says which
    assert explain("'NoneType' object has no attribute 'module'") is None


def _module_of_a_plain_model(env):
    return nn.Linear(3, 1).module


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_check_cell_gives_torchs_line_where_it_was_raised_then_the_cause_and_the_fix():
    with pytest.raises(CheckFailed) as err:
        run_forked(_module_of_a_plain_model, 2, name="evaluate")
    line = str(err.value)
    line_of = inspect.getsourcelines(_module_of_a_plain_model)[1] + 1
    assert re.match(rf"a rank failed: rank [01] raised AttributeError \(line {line_of}\): 'Linear' object has no "
                    r"attribute 'module'; `.module` is the model inside DDP's wrapper", line), line
    assert "\n" not in line
