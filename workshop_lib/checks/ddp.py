"""The exercise checks of notebook 03 (DDP): each runs the learner's own function and names the mistake.

As in :mod:`workshop_lib.checks.common`: a tick and one line when the exercise works,
else :class:`CheckFailed` with one line. The checks that need collectives run on
2 ranks forked by :func:`workshop_lib.lab.forklaunch.notebook_launch`; the ones
about rank vs local rank use a made-up rank 3 of 4, local rank 1, on a node with
2 GPUs, which no real process needs to be.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable

import torch

from workshop_lib.checks import rules, step_rules
from workshop_lib.checks.common import CheckFailed, _missed, _passed, run_forked, train_on_two_nodes
from workshop_lib.debug.patching import patched
from workshop_lib.distributed import DistEnv

_GPU_ENV = DistEnv(rank=3, local_rank=1, world_size=4, local_world_size=2, device=torch.device("cuda", 1),
                   backend="nccl")
_CPU_ENV = DistEnv(rank=3, local_rank=1, world_size=4, local_world_size=2, device=torch.device("cpu"),
                   backend="gloo")


class _FakeDDP:
    """Stands in for DistributedDataParallel: records what the wrap asked for, joins no group."""

    def __init__(self, module, device_ids=None, *args, **kwargs):
        self.module, self.device_ids = module, device_ids


def _device_ids(wrap: Callable, env: DistEnv):
    import torch.nn.parallel as parallel

    from workshop_lib.model import SmilesLSTM

    names = wrap.__globals__
    with contextlib.ExitStack() as fakes:
        for k in ("DDP", "DistributedDataParallel"):
            if k in names:
                fakes.enter_context(patched(names, k, lambda _: _FakeDDP))
        fakes.enter_context(patched(parallel, "DistributedDataParallel", lambda _: _FakeDDP))
        try:
            wrapped = wrap(SmilesLSTM(12, 8, 8), env)
        except NotImplementedError:
            raise CheckFailed("wrap still raises NotImplementedError: fill in its TODO and run its cell again") from None
    return wrapped.device_ids if isinstance(wrapped, _FakeDDP) else "no wrap"


def _ids(ids) -> list | None:
    return None if ids is None else [torch.device(i).index if not isinstance(i, int) else i for i in ids]


def _ddp_step(env: DistEnv, wrap: Callable) -> dict:
    """On one rank: differently initialised replicas, wrapped, one step on this rank's own batch."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from workshop_lib.model import SmilesLSTM

    torch.manual_seed(env.rank)  # a different start on every rank: DDP must make them equal
    model = SmilesLSTM(12, 8, 8)
    wrapped = wrap(model, env)
    if not isinstance(wrapped, DDP):
        return {"outcome": f"wrap returned a {type(wrapped).__name__}, not a DistributedDataParallel: "
                           f"wrap the model so that backward() averages the gradients"}
    if wrapped.module is not model:
        return {"outcome": "the DDP wrapper holds another model than the one passed in: wrap `model` itself"}
    g = torch.Generator().manual_seed(100 + env.rank)  # each rank its own data
    tokens = torch.randint(1, 12, (4, 6), generator=g)  # (B, T)
    labels = torch.tensor([0.0, 1.0, 1.0, 0.0])
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.5)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(wrapped(tokens, torch.full((4,), 6)), labels)
    loss.backward()
    opt.step()
    mine = torch.nn.utils.parameters_to_vector(model.parameters()).detach()  # (P,)
    everyone = [torch.empty_like(mine) for _ in range(env.world_size)]
    dist.all_gather(everyone, mine)
    return {"outcome": "ok", "spread": max((w - everyone[0]).abs().max().item() for w in everyone)}


def ddp_ids(wrap: Callable) -> None:
    """``wrap``'s device_ids for a CPU model and for local rank 1 on a GPU node (no process group needed)."""
    cpu = _device_ids(wrap, _CPU_ENV)
    if cpu == "no wrap":
        raise CheckFailed("wrap did not return DistributedDataParallel around the model: wrap it, so that "
                          "backward() averages the gradients")
    if cpu is not None:
        raise CheckFailed(f"wrap gave device_ids={cpu} for a CPU model: device_ids names a GPU; give none on CPU")
    gpu = _ids(_device_ids(wrap, _GPU_ENV))
    if gpu != [1]:
        why = {None: "none: on a GPU, name the one device this replica lives on",
               3: "the global rank: rank 3 of 4 on a node with 2 GPUs lives on cuda:1, its local rank"}
        raise CheckFailed(f"as rank 3 of 4 (local rank 1) on a GPU, wrap gave device_ids={gpu}, "
                          f"{why.get(gpu[0] if gpu else None, 'expected [1], its local rank')}")


def ddp_wrap(wrap: Callable, nprocs: int = 2, timeout: float = 60) -> None:
    """``wrap(model, env)``: DDP around ``model``, device_ids by device, so one step leaves the replicas equal."""
    ddp_ids(wrap)
    ranks = run_forked(_ddp_step, nprocs, wrap, timeout=timeout)
    for r in ranks:
        if r["outcome"] != "ok":
            raise CheckFailed(r["outcome"])
    spread = max(r["spread"] for r in ranks)
    if spread != 0.0:
        raise CheckFailed(f"after one step the replicas differ by up to {spread:.3g}: the gradients were not averaged")
    _passed(f"wrap: device_ids None on CPU and [local rank] on a GPU; {nprocs} replicas started different, DDP "
            f"made them equal and one step kept them equal")


# ------------------------------------------------------------------ gradients by hand


def _by_hand(env: DistEnv, fn: Callable) -> dict:
    """One step of a plain model with ``fn`` averaging its gradients, and one of the same model under DDP."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from workshop_lib.checks import record
    from workshop_lib.model import SmilesLSTM

    torch.manual_seed(0)
    plain = SmilesLSTM(12, 8, 8, 1, 0.0)  # no dropout: both copies must compute the same thing
    wrapped = DDP(copy.deepcopy(plain))
    g = torch.Generator().manual_seed(100 + env.rank)  # each rank its own batch
    tokens = torch.randint(1, 12, (4, 6), generator=g)  # (B, T)
    labels = torch.tensor([0.0, 1.0, 1.0, 0.0])
    for model in (plain, wrapped):
        torch.nn.functional.binary_cross_entropy_with_logits(model(tokens, torch.full((4,), 6)), labels).backward()
    local = [p.grad.clone() for p in plain.parameters()]
    rec = record.Recorder()
    with record.spying(rec):
        fn(plain, env)
    ops = [e.get("op") for e in rec.events if e["kind"] == "collective" and e["phase"] == "enter"]
    ddp_grads = [p.grad for p in wrapped.module.parameters()]
    mine = list(plain.parameters())

    def gap(scale: float, reference) -> float:
        return max((p.grad - scale * r).abs().max().item() for p, r in zip(mine, reference, strict=True))

    for model in (plain, wrapped.module):
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.5 * p.grad
    weights = max((a - b).abs().max().item() for a, b in zip(mine, wrapped.module.parameters(), strict=True))
    return {"ops": ops, "weights": weights, "summed": gap(env.world_size, ddp_grads), "unchanged": gap(1, local)}


def average_gradients(fn: Callable, nprocs: int = 2, timeout: float = 60) -> None:
    """``fn(model, env)`` must leave every p.grad the mean over the ranks: one step then matches DDP's to 1e-6."""
    ranks = run_forked(_by_hand, nprocs, fn, timeout=timeout, name="average_gradients")
    for rank, r in enumerate(ranks):
        if r["weights"] <= 1e-6:
            continue
        op = next((o for o in r["ops"] if o and o != "SUM"), None)
        if op:
            raise CheckFailed(f"rank {rank} all-reduced with op={op}: sum the gradients (ReduceOp.SUM), then divide")
        if not r["ops"] or r["unchanged"] <= 1e-7:
            raise CheckFailed(f"rank {rank}'s gradients are its own batch's alone: all-reduce every p.grad")
        if r["summed"] <= 1e-6:
            raise CheckFailed(f"rank {rank}'s gradients are the sum over the ranks, not the mean: divide each by "
                              f"env.world_size after the all-reduce")
        raise CheckFailed(f"after one step rank {rank}'s weights differ from DDP's by {r['weights']:.3g} (> 1e-6)")
    worst = max(r["weights"] for r in ranks)
    _passed(f"average_gradients: after one step the weights match DDP's on all {nprocs} ranks (largest difference "
            f"{worst:.1e}, within 1e-6)")


# ------------------------------------------------------------------ the training function, the speed-up


def rank0_duties(train: Callable, nprocs: int = 2, timeout: float = 120) -> None:
    """The step-3 ``train`` on 2 ranks, one per "node": the DDP wrap, rank-0 evaluation and saving, the mean loss."""
    events = train_on_two_nodes(train, nprocs, timeout)
    for rule in (rules.open_todo, step_rules.sharding, step_rules.wrapping, step_rules.evaluating, step_rules.saving,
                 rules.crashed, rules.skipped_collective, step_rules.reshuffling, step_rules.averaging):
        message = rule(events, world_size=nprocs, epochs=2)
        if message:
            raise CheckFailed(message)
    _passed("train: the model is wrapped in DDP; only global rank 0 evaluated and saved, through the plain model; "
            "the logged loss is the mean over the ranks")


def speedup_prediction(predicted: float | None, speed: dict[int, float], close: float = 0.25) -> None:
    """The learner's predicted speed-up of 2 processes over 1 against the measured one (``speed``: samples/s by
    processes). A prediction is not code: a wrong one is printed with a cross and the reason, not raised."""
    measured = speed[2] / speed[1]
    why = ("every step ends with an all-reduce that each rank must reach before it steps (gloo over loopback TCP "
           "here: several round trips, costly against this small model's step), and two busy processes share the "
           "machine's cores, caches and memory bandwidth; a larger step per all-reduce (a bigger batch or model) "
           "gets nearer 2x")
    if predicted is None:
        print(f"measured {measured:.2f}x (no prediction to compare: set predicted_speedup before the run); {why}")
    elif abs(predicted - measured) <= close:
        _passed(f"you predicted {predicted:.2f}x, measured {measured:.2f}x: within {close:g}; {why}")
    elif predicted > measured:
        _missed(f"you predicted {predicted:.2f}x, measured {measured:.2f}x: less, since {why}")
    else:
        _missed(f"you predicted {predicted:.2f}x, measured {measured:.2f}x: more, since each process computes half of "
                f"the global batch in the time one took for all of it, and the all-reduce costs less than that half")
