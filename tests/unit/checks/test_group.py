"""engine.made_up_rank.process_group: the learner's setup(timeout) joined for real by 2 ranks on this machine (CPU,
Gloo, torchrun's variables), then as rank 3 of 4 (local rank 1) on a made-up 2-GPU node, where init_process_group is
observed, not called.

Every textbook form that a real run here accepts passes (env://, with or without timeout=, device_id= this
process's GPU); each wrong one is named, a real run's mistake with torch's own error, its line and the fix.
"""

from __future__ import annotations

import inspect
import os
import re
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from tests.conftest import REPO, in_213_words
from workshop_lib.checks import group
from workshop_lib.engine import common, made_up_rank

GPU_INIT = '        dist.init_process_group("nccl", timeout=timedelta(seconds=timeout), device_id=device)\n'
CPU_INIT = '        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))\n'
LOCAL = 'int(os.environ["LOCAL_RANK"])'


def solution(step: str, *edits: tuple[str, str]) -> dict:
    """The names solutions/<step>.py defines, each ``(old, new)`` replaced once first (its main does not run)."""
    path = REPO / "solutions" / f"{step}.py"
    text = path.read_text()
    for old, new in edits:
        assert text.count(old) == 1, f"{old!r} is not in {path.name} exactly once: update the test"
        text = text.replace(old, new)
    names: dict = {"__name__": f"solution_{step}", "__file__": str(path)}
    exec(compile(text, str(path), "exec"), names)
    return names


def setup_with(*edits: tuple[str, str]):
    return solution("step1_process_group", *edits)["setup"]


def test_the_solution_passes_without_notes(capsys):
    made_up_rank.process_group(setup_with())
    out = capsys.readouterr().out
    assert out == ("\N{CHECK MARK} setup: NCCL on cuda:1 as local rank 1 of a node with 2 GPUs, Gloo on a CPU; joined "
                   "as rank 3 of 4 through torchrun's variables; device_id=cuda:1 given (optional: with it NCCL "
                   "connects at init_process_group, so a bad GPU shows there rather than at the first collective)\n")


@pytest.mark.parametrize("edits", [
    [(GPU_INIT, '        dist.init_process_group("nccl", timeout=timedelta(seconds=timeout))\n')],
    [(GPU_INIT, f'        dist.init_process_group("nccl", timeout=timedelta(seconds=timeout), device_id={LOCAL})\n')],
    [(GPU_INIT, '        dist.init_process_group("nccl", "env://", timeout=timedelta(seconds=timeout), '
                'device_id=device)\n')],
    [(GPU_INIT, '        dist.init_process_group("nccl", rank=int(os.environ["RANK"]), world_size=int(os.environ['
                '"WORLD_SIZE"]), device_id=device)\n')],
    [(GPU_INIT, "        dist.init_process_group(timeout=timedelta(seconds=timeout), device_id=device)\n"),
     (CPU_INIT, "        dist.init_process_group(timeout=timedelta(seconds=timeout))\n")],
], ids=["without_device_id", "device_id_int", "env_explicit", "rank_from_the_environment", "backend_left_out"])
def test_every_textbook_form_passes(edits, capsys):
    made_up_rank.process_group(setup_with(*edits))
    assert "joined as rank 3 of 4 through torchrun's variables" in capsys.readouterr().out


# The forms of torch's docs (2.13 to 2.15), each as a learner would write setup with it.

def setup_accelerator(timeout):
    """The device-agnostic form: torch.accelerator, the backend for the device."""
    acc = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None  # a CUDA build
    if acc is not None:  # names cuda even without a GPU (torch 2.15), so ask is_available() first
        torch.accelerator.set_device_index(int(os.environ["LOCAL_RANK"]))
        device = torch.device(acc.type, int(os.environ["LOCAL_RANK"]))
    else:
        device = torch.device("cpu")
    dist.init_process_group(dist.get_default_backend_for_device(device), timeout=timedelta(seconds=timeout))
    return device


def setup_accelerator_device_id(timeout):
    device = torch.device("cpu")
    if torch.accelerator.is_available():
        device = torch.device(f"{torch.accelerator.current_accelerator()}:{os.environ['LOCAL_RANK']}")
        torch.accelerator.set_device_index(device)
    backend = dist.get_default_backend_for_device(device)
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout),
                            device_id=device if device.type != "cpu" else None)
    return device


def setup_no_backend(timeout):
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available() and torch.cuda.device_count() > local_rank:
        torch.cuda.set_device(local_rank)
    dist.init_process_group(timeout=timedelta(seconds=timeout))  # torch picks gloo for CPU, nccl for CUDA tensors
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def setup_backend_per_device(timeout):
    device = torch.device("cpu")
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    dist.init_process_group("cpu:gloo,cuda:nccl", timeout=timedelta(seconds=timeout))
    return device


def setup_mapping(timeout):
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = {"cuda": "nccl", "cpu": "gloo"}[device.type]
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout), device_id=device if device.index else None)
    return device


@pytest.mark.parametrize("setup", [setup_accelerator, setup_accelerator_device_id, setup_no_backend, setup_mapping])
def test_every_form_of_the_torch_docs_passes(setup, capsys):
    made_up_rank.process_group(setup)
    out = capsys.readouterr().out
    assert out.startswith("\N{CHECK MARK} setup: NCCL on cuda:1 as local rank 1 of a node with 2 GPUs")
    given = setup in (setup_accelerator_device_id, setup_mapping)
    assert ("device_id=cuda:1 given (optional:" if given else "no device_id (optional: with it NCCL connects") in out


def test_a_backend_per_device_naming_nccl_is_what_a_real_run_without_nccl_rejects():
    """torch's docs' "cpu:gloo,cuda:nccl": init_process_group builds NCCL too, and this torch (CPU only) has none, so
    torchrun here would fail; the check says so with torch's words, the line and the fix."""
    line = inspect.getsourcelines(setup_backend_per_device)[1] + 5
    with pytest.raises(common.CheckFailed) as failed:
        made_up_rank.process_group(setup_backend_per_device)
    assert (f"setup raised RuntimeError (line {line}): Distributed package doesn't have NCCL built in; "
            "init_process_group builds every backend of 'cpu:gloo,cuda:nccl', NCCL too, which needs GPUs and a torch "
            'built with NCCL: where there is no GPU pass "gloo", or leave the backend out') in in_213_words(
        str(failed.value)), failed.value


def test_a_backend_hard_coded_for_one_device_names_the_rule_not_the_other_backend():
    """A per-device string that lacks the GPU's entry is named as the one-backend string is: the same fix."""
    def setup(timeout):
        device = torch.device("cuda", 1) if torch.cuda.is_available() else torch.device("cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("cpu:gloo", timeout=timedelta(seconds=timeout))
        return device

    with pytest.raises(common.CheckFailed, match=re.escape(
            "on a node with 2 GPUs setup joined with backend 'cpu:gloo', which has no nccl for cuda tensors: join with "
            "the backend for the device, dist.get_default_backend_for_device(device)")):
        made_up_rank.process_group(setup)


def test_a_join_without_timeout_passes_with_a_note(capsys):
    made_up_rank.process_group(setup_with((CPU_INIT, '        dist.init_process_group("gloo")\n')))
    assert "; without timeout=, a rank waits torch's default (10 min on NCCL, 30 on Gloo) for a missing peer\n" \
        in capsys.readouterr().out


@pytest.mark.parametrize(("edits", "message"), [
    ([(GPU_INIT, f'        dist.init_process_group("nccl", rank={LOCAL}, world_size=4, device_id=device)\n')],
     "as rank 3 of 4 (local rank 1) setup joined with rank=1, its local rank: leave rank= out under torchrun"),
    ([(LOCAL, 'int(os.environ["RANK"])')],
     "as local rank 1 on a node with 2 GPUs, setup called torch.cuda.set_device with [3], the global rank"),
    ([("        torch.cuda.set_device(device)\n", "")],
     "as local rank 1 on a node with 2 GPUs, setup never called torch.cuda.set_device"),
    ([(CPU_INIT, CPU_INIT.replace('"gloo"', '"nccl"'))],
     "setup raised RuntimeError (line {cpu_init}): Distributed package doesn't have NCCL built in; nccl needs GPUs: use "
     "gloo on CPU (dist.get_default_backend_for_device picks it) (in a real run of 2 ranks on this machine"),
    ([(GPU_INIT, GPU_INIT.replace('"nccl",', '"gloo",'))],
     "on a node with 2 GPUs setup joined with backend 'gloo', which has no nccl for cuda tensors: join with the "
     "backend for the device, dist.get_default_backend_for_device(device) (nccl on a GPU, gloo on a CPU)"),
    ([(GPU_INIT, '        dist.init_process_group("nccl", store=dist.HashStore(), device_id=device)\n')],
     "init_process_group got store= but not both rank= and world_size=: with a store torch needs all three"),
    ([(GPU_INIT, GPU_INIT.replace("device_id=device", 'device_id=torch.device("cuda", int(os.environ["RANK"]))'))],
     "on a node with 2 GPUs, as local rank 1, setup passed device_id=cuda:3 (the global rank): device_id is this "
     "process's own GPU, cuda:LOCAL_RANK"),
    ([("    return device\n", '    return torch.device("cuda", 0) if torch.cuda.is_available() else device\n')],
     "as local rank 1 on a node with 2 GPUs, setup returned cuda:0: return cuda:LOCAL_RANK, its own GPU"),
    ([(CPU_INIT, "        raise NotImplementedError\n")],
     "setup still raises NotImplementedError: fill in its TODO"),
    ([(GPU_INIT, '        dist.init_process_group("nccl", timeout=timeout, device_id=device)\n')],
     "setup passed init_process_group timeout=6.0, a float: torch raises TypeError there; init_process_group's "
     "timeout is a datetime.timedelta, not a number: timeout=timedelta(seconds=...)"),
], ids=["local_rank_as_rank", "device_of_the_global_rank", "no_set_device", "nccl_without_gpus", "gloo_on_gpus",
        "store_without_rank", "device_id_global_rank", "returns_cuda_0", "todo", "timeout_in_seconds"])
def test_a_wrong_setup_is_named(edits, message):
    text = (REPO / "solutions" / "step1_process_group.py").read_text()
    cpu_init = text[:text.index(CPU_INIT)].count("\n") + 1
    with pytest.raises(common.CheckFailed) as failed:
        made_up_rank.process_group(setup_with(*edits))
    assert message.format(cpu_init=cpu_init) in in_213_words(str(failed.value)), failed.value


def test_the_made_up_node_keeps_what_setup_called_in_the_one_record():
    """The made-up node's fakes keep no record of their own: set_device and init_process_group go to a Recorder, with
    the learner's line, in the events the real run's record has (init: enter, then exit with the rank joined as)."""
    text = (REPO / "solutions" / "step1_process_group.py").read_text()
    mistake, events = made_up_rank._on_a_gpu_node(setup_with())
    assert mistake is None
    called = [e for e in events if e["kind"] in ("set_device", "init")]
    assert [(e["kind"], e.get("phase")) for e in called] == [("set_device", None), ("init", "enter"), ("init", "exit")]
    set_device, init, joined = called
    assert (set_device["index"], set_device["line"]) == (1, _line(text, "torch.cuda.set_device(device)"))
    assert (init["backend"], init["given_device_id"], init["line"]) == ("nccl", "cuda:1", _line(text, GPU_INIT.strip()))
    assert (joined["rank"], joined["world_size"]) == (3, 4)
    wrong = made_up_rank._on_a_gpu_node(setup_with((LOCAL, 'int(os.environ["RANK"])')))[0]  # judged from that record
    assert "setup called torch.cuda.set_device with [3], the global rank" in wrong


def _line(text: str, code: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if code in line)


# Setups that a real run of 2 ranks on this machine rejects (torchrun --standalone --nproc_per_node=2 here), each
# passed by the check when it ran setup as a made-up rank: the check now names torch's own error, the line, the fix.

def setup_joined_twice(timeout):
    dist.init_process_group("gloo")  # to read the rank early
    device = torch.device("cpu")
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    dist.init_process_group(dist.get_default_backend_for_device(device), timeout=timedelta(seconds=timeout))
    return device


def setup_failing_on_rank_1(timeout):
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    if dist.get_rank() == 1:
        raise ValueError("rank 1 could not open its data folder")
    return torch.device("cpu")


def setup_four_ranks(timeout):
    device = torch.device("cpu")
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    dist.init_process_group(dist.get_default_backend_for_device(device), rank=int(os.environ["RANK"]), world_size=4,
                            timeout=timedelta(seconds=timeout))
    return device


def setup_local_rank_as_rank(timeout):
    device = torch.device("cpu")
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    dist.init_process_group(dist.get_default_backend_for_device(device), rank=int(os.environ["LOCAL_RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]), timeout=timedelta(seconds=timeout))
    return device


def setup_device_set_everywhere(timeout):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    dist.init_process_group(dist.get_default_backend_for_device(device), timeout=timedelta(seconds=timeout))
    return device


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("setup", "at", "message"), [
    (setup_joined_twice, 6, "setup raised ValueError (line {line}): trying to initialize the default process group "
                            "twice! (in a real run of 2 ranks on this machine (torchrun's variables, no GPU), rank 0)"),
    pytest.param(setup_four_ranks, 5, "init_process_group was given world_size=4 (line {line}), and torchrun started "
                 "this rank with WORLD_SIZE=2: leave world_size= out under torchrun (env:// reads WORLD_SIZE)",
                 marks=pytest.mark.slow),  # a join that waits out its 6 s timeout
    # two nodes of one rank each, as the script checker starts a script: LOCAL_RANK is 0 on both
    pytest.param(setup_local_rank_as_rank, 5, "init_process_group was given rank=0 (line {line}), and torchrun started "
                 "this rank with RANK=1: leave rank= out under torchrun (env:// reads RANK) (in a real run of 2 ranks "
                 "on this machine (torchrun's variables, no GPU), rank 1)", marks=pytest.mark.slow),
    (setup_device_set_everywhere, 2, "setup raised AttributeError (line {line}): module 'torch._C' has no attribute "
                                     "'_cuda_setDevice'; this machine has no GPU: call CUDA only where "
                                     "torch.cuda.is_available()"),
    # one rank's setup fails after the join: its error, not the other rank's lost connection
    (setup_failing_on_rank_1, 3, "setup raised ValueError (line {line}): rank 1 could not open its data folder (in a "
                                 "real run of 2 ranks on this machine (torchrun's variables, no GPU), rank 1)"),
], ids=["joined_twice", "four_ranks", "local_rank_as_rank", "set_device_without_gpus", "fails_on_rank_1"])
def test_a_setup_that_a_real_run_rejects_is_named_with_its_cause(setup, at, message):
    if setup is setup_device_set_everywhere and torch.cuda.is_available():
        pytest.skip("torch.cuda.set_device works where there is a GPU")
    if setup is setup_device_set_everywhere and torch.backends.cuda.is_built():
        # a CUDA build without GPUs words torch's error its own way: no driver, or, where this process tried CUDA
        # before the ranks were forked (an earlier test), no CUDA in a forked child; both causes end in this fix
        message = "call CUDA only where torch.cuda.is_available()"
    line = inspect.getsourcelines(setup)[1] + at
    with pytest.raises(common.CheckFailed, match=re.escape(message.format(line=line))) as err:
        made_up_rank.process_group(setup)
    assert "\n" not in str(err.value)


def test_the_notebooks_reach_the_script_check_and_setups_through_the_facade():
    from workshop_lib import check
    from workshop_lib.engine import script

    assert check.script is script.check and check.process_group is made_up_rank.process_group


RESULTS = [{"all_gather": torch.tensor([1.0, 2.0, 10.0, 20.0]), "all_reduce": torch.tensor([11.0, 22.0])}] * 2


@pytest.mark.parametrize(("predicted", "said"), [
    ({"all_gather": [1.0, 2.0, 10.0, 20.0]}, "\N{CHECK MARK} all_gather: you predicted [1.0, 2.0, 10.0, 20.0], "
                                              "measured [1.0, 2.0, 10.0, 20.0] on rank 1\n"),
    ({"all_gather": [[1, 2], [10, 20]]}, "\N{CHECK MARK} all_gather: you predicted [[1, 2], [10, 20]], measured "
                                         "[1.0, 2.0, 10.0, 20.0] on rank 1; read as one list, rank 0's values first: the "
                                         "cell returns the gathered tensors concatenated\n"),
    ({"all_reduce": "eleven"}, "\N{BALLOT X} all_reduce: you predicted 'eleven', measured [11.0, 22.0] on rank 1; not a "
                               "list of numbers\n"),
    ({"all_reduce": [11, 21]}, "\N{BALLOT X} all_reduce: you predicted [11, 21], measured [11.0, 22.0] on rank 1\n"),
    ({"all_reduce": None}, "\N{BALLOT X} all_reduce: no prediction, measured [11.0, 22.0] on rank 1\n"),
], ids=["flat", "a_list_per_rank", "not_numbers", "wrong", "none"])
def test_a_prediction_of_any_shape_is_judged_in_one_line_never_raised(predicted, said, capsys):
    group.collectives_prediction(predicted, RESULTS)
    assert capsys.readouterr().out == said


def _reduce_on(device):
    value = torch.tensor([dist.get_rank() + 1.0], device=device)
    dist.all_reduce(value)
    assert value.tolist() == [3.0]


def _reduce_max_on(device):
    value = torch.tensor([dist.get_rank() + 1.0], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_cell_and_the_script_checker_judge_an_all_reduce_with_one_judge():
    """check.all_reduce's verdict on a wrong op is rules.all_reduced's, the script checker's check_all_reduce rule's,
    with the learner's line."""
    line = inspect.getsourcelines(_reduce_max_on)[1] + 2
    with pytest.raises(common.CheckFailed) as failed:
        group.all_reduce(_reduce_max_on)
    assert str(failed.value) == f"rank 0 used op=MAX (line {line}): summing needs op=dist.ReduceOp.SUM"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_all_reduce_is_judged_from_the_record_of_a_real_run_and_of_a_meta_pass_with_nothing_else_said(capfd):
    """check.all_reduce reads each rank's record of calls twice: the real run (what each rank held before and after)
    and a pass given ``meta`` for a GPU (where the tensor was made); the record keeps no values of a meta tensor and
    says nothing more than the verdict."""
    group.all_reduce(_reduce_on)
    out = capfd.readouterr().out  # rank 0's log comes back on stdout: nothing in it but the verdict
    assert out == ("\N{CHECK MARK} _reduce_on: each of 2 ranks contributed rank + 1, all_reduce(SUM) left 3 on every "
                   "rank\n"), out
