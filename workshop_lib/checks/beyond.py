"""The checks of notebook 06 (beyond DDP): compile with DDP, FSDP2's evaluation and saving, a DCP resume.

:func:`compiled_ddp` and :func:`fsdp` run the learner's functions on 2 forked ranks; :func:`resume` loads what 2 DDP
ranks saved with ``torch.distributed.checkpoint`` in the kernel, one process with no process group."""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from workshop_lib.engine.common import (
    CheckFailed,
    _call,
    as_share,
    first,
    is_number,
    judge_prediction,
    run_forked,
    said,
    verdict,
)

MLP_BUCKETS = 4  # DDP's buckets of MLP() at bucket_cap_mb=1: the last Linear with the one before, then one each


class MLP(nn.Module):
    """4 MiB that Dynamo traces whole (a class of our own: DDP calls nn.Sequential from code Dynamo skips)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(512, 512), nn.ReLU())],
                                    nn.Linear(512, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)  # (B, 1)


def counting_backend(graphs: list) -> Callable:
    """A torch.compile backend of our own: it notes the number of ops of each graph Dynamo hands it, then runs it."""
    def backend(gm: torch.fx.GraphModule, example_inputs) -> Callable:
        graphs.append(sum(n.op.startswith("call_") for n in gm.graph.nodes))
        return gm.forward
    return backend


# ------------------------------------------------------------------ 1. torch.compile with DDP


def _compiled(env, fn: Callable) -> dict:
    import torch.distributed as dist

    torch.compiler.reset()  # a forked rank starts without the kernel's compiled code
    graphs: list[int] = []
    torch.manual_seed(0)
    model = _call(fn, "compile_and_wrap", MLP(), counting_backend(graphs), 1)
    x = torch.randn(8, 512, generator=torch.Generator().manual_seed(env.rank))  # each rank its own batch
    F.binary_cross_entropy_with_logits(model(x), torch.ones(8, 1)).backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    gathered = [torch.empty_like(grads) for _ in range(env.world_size)]
    dist.all_gather(gathered, grads)
    return {"graphs": graphs, "keys": list(model.state_dict()),
            "same_grads": all(torch.equal(g, gathered[0]) for g in gathered)}


def compiled_ddp(fn: Callable, predicted: int | None = None, nprocs: int = 2, timeout: float = 60) -> None:
    """``fn(model, backend, bucket_cap_mb)`` compiles ``MLP()`` and wraps it in DDP: one graph a bucket; then the
    learner's ``predicted`` number of graphs, with a tick or a cross."""
    r = run_forked(_compiled, nprocs, fn, timeout=timeout, name="compile_and_wrap")[0]
    graphs, key = r["graphs"], r["keys"][0]
    verdict(first((not graphs, "Dynamo compiled no graph: compile the model with the backend given "
                               "(model.compile(backend=backend)), then wrap it in DDP"),
                  (not r["same_grads"], "the ranks hold different gradients after backward(): wrap the compiled model "
                                        "in DDP, which averages them"),
                  (key.startswith("_orig_mod."), f"you compiled the DDP wrapper (keys read {key}): torch's docs advise "
                                                 f"compiling the inner model in place, model.compile(...), then wrapping "
                                                 f"it in DDP"),
                  ("_orig_mod." in key, f"the keys read {key}: torch.compile(model) returned a wrapper whose keys gain "
                                        f"_orig_mod.; model.compile(...) compiles in place and keeps the model's keys"),
                  (len(graphs) != MLP_BUCKETS, f"Dynamo compiled {len(graphs)} graphs, expected one per DDP bucket "
                                               f"({MLP_BUCKETS} at bucket_cap_mb=1): pass bucket_cap_mb to DDP")),
            f"compiled, then wrapped: Dynamo handed the backend {len(graphs)} graphs (ops: {', '.join(map(str, graphs))}), "
            f"one per DDP bucket; the ranks hold the same gradients; keys as {key}")
    judge_prediction("the graphs", predicted, len(r["graphs"]), predicted == len(r["graphs"]), "one per DDP bucket")


# ------------------------------------------------------------------ 2. FSDP2: shard, evaluate, save


def share_prediction(predicted: float | None, share: float) -> None:
    """The learner's share of DDP's bytes that FSDP2 holds per rank (0.5, or 50 for 50%), against the run's, right
    within 0.1 (a tensor that does not divide by N leaves a rank a few percent more); never raised."""
    predicted = as_share(predicted)  # 50 for 50%: the percent meant
    number = is_number(predicted)
    judge_prediction("FSDP2's share of DDP's bytes per rank", predicted, f"{share:.0%}",
                     number and abs(predicted - share) <= 0.1,
                     "each of N ranks holds 1/N of the weights, the gradients and the optimizer's state",
                     shown=f"{predicted:.0%}" if number else None)


def _small_model() -> nn.Module:
    from workshop_lib.model import SmilesLSTM

    torch.manual_seed(0)
    return SmilesLSTM(12, 8, 8, 1, 0.0)  # no dropout: every rank's forward computes the same thing


def _sharded(env, shard: Callable, evaluate_and_save: Callable, path: str) -> dict:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule

    model = _small_model()
    whole = copy.deepcopy(model)
    _call(shard, "shard", model, init_device_mesh("cpu", (env.world_size,)))
    units = [name or "the model" for name, m in model.named_modules() if isinstance(m, FSDPModule)]
    forwards = []
    mark = Path(path).with_name(f"forward{env.rank}")  # read by the check, even when a rank dies in a collective

    def count(*_) -> None:
        forwards.append(1)
        mark.touch()

    model.register_forward_pre_hook(count)
    tokens = torch.randint(1, 12, (6, 5), generator=torch.Generator().manual_seed(7))  # (B, T)
    lengths = torch.tensor([5, 4, 3, 5, 2, 5])
    error, logits = None, None
    try:
        logits = evaluate_and_save(model, tokens, lengths, path)
    except NotImplementedError:
        raise  # the check says: fill in its TODO
    except Exception as err:  # judged with the forwards below: a rank alone in a collective fails
        error = said(err, "evaluate_and_save")
    dist.barrier()  # the ranks go on together, as a training loop would
    saved = torch.load(path, weights_only=False) if env.rank == 0 and Path(path).exists() else None
    with torch.no_grad():
        expected = whole(tokens, lengths)
    return {"units": units, "forwards": len(forwards), "error": error,
            "logits_ok": logits is not None and torch.allclose(logits, expected, atol=1e-6),
            "saved": None if saved is None else {k: (type(v).__name__, type(v) is torch.Tensor
                                                      and torch.equal(v, whole.state_dict().get(k, torch.empty(0))))
                                                  for k, v in saved.items()},
            "keys": list(whole.state_dict())}


def fsdp(shard: Callable, evaluate_and_save: Callable, nprocs: int = 2, timeout: float = 60) -> None:
    """``shard(model, mesh)`` then ``evaluate_and_save(model, tokens, lengths, path)`` on FSDP2: the classic mistakes."""
    path = str(Path(tempfile.mkdtemp(prefix="fsdp-check-")) / "model.pt")
    alone = ("under FSDP a forward all-gathers the weights, so evaluation runs on every rank, not on rank 0 alone "
             "(which waits for the others)")
    try:
        ranks = run_forked(_sharded, nprocs, shard, evaluate_and_save, path, timeout=timeout, hang_after=3,
                           name="evaluate_and_save", fix="under FSDP every rank must run the forward (it all-gathers "
                                                         "the weights)")
    except CheckFailed:
        ran = [r for r in range(nprocs) if Path(path).with_name(f"forward{r}").exists()]
        if ran and len(ran) < nprocs:
            raise CheckFailed(f"only rank {', '.join(map(str, ran))} ran the forward: {alone}") from None
        raise
    forwards, units, saved = [r["forwards"] for r in ranks], ranks[0]["units"], ranks[0]["saved"] or {}
    kind = next((kind for kind, _ in saved.values() if kind != "Tensor"), None)
    verdict(first((len(set(forwards)) > 1, f"the ranks ran the forward {forwards} times: {alone}"),
                  *((True, r["error"]) for r in ranks if r["error"]),
                  (len(units) < 4, f"fully_shard units: {', '.join(units)}: call fully_shard on each LSTM and on the "
                                   f"head, then on the model, so that one block at a time is whole"),
                  (not all(r["logits_ok"] for r in ranks), "evaluate_and_save must return the model's logits on every "
                                                           "rank, as the unsharded model computes them"),
                  (ranks[0]["saved"] is None, "rank 0 saved no file at path: torch.save the gathered state dict there"),
                  (kind, f"the file holds {kind}s, each rank's shard: under FSDP model.state_dict() is sharded; gather "
                         f"it with get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, "
                         f"cpu_offload=True))"),
                  (sorted(saved) != sorted(ranks[0]["keys"]) or not all(same for _, same in saved.values()),
                   "the saved weights are not the whole model's: save the full state dict, as gathered")),
            f"{len(units)} fully_shard units; every rank ran the forward once and got the unsharded model's logits; "
            f"rank 0 saved {len(saved)} full tensors equal to the model's weights")


# ------------------------------------------------------------------ 3. a checkpoint that changes world size


def _train_and_save(env, path: str) -> dict:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_small_model())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(env.rank)
    for _ in range(2):
        tokens = torch.randint(1, 12, (4, 5), generator=g)  # (B, T)
        loss = F.binary_cross_entropy_with_logits(model(tokens, torch.full((4,), 5)), torch.tensor([0.0, 1, 1, 0]))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model_state, optim_state = get_state_dict(model, optimizer)  # keys without DDP's module.
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=path)
    return {"model": {k: v.clone() for k, v in model_state.items()},
            "exp_avg": {k: s["exp_avg"].clone() for k, s in optim_state["state"].items()}}


def resume(fn: Callable, nprocs: int = 2, timeout: float = 60) -> None:
    """``fn(path)`` resumes, in this one process, what 2 DDP ranks saved with DCP: the weights and AdamW's state."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    path = tempfile.mkdtemp(prefix="dcp-check-")
    saved = run_forked(_train_and_save, nprocs, path, timeout=timeout)[0]
    got = _call(fn, "resume", path)
    if not (isinstance(got, tuple) and len(got) == 2):
        raise CheckFailed("resume must return (model, optimizer)")
    model, optimizer = got
    weights = model.state_dict()

    def mistake() -> str | None:  # each check asked once those before it held
        if sorted(weights) != sorted(saved["model"]):
            return (f"the model's keys ({next(iter(weights), 'none')}, ...) are not the saved ones "
                    f"({next(iter(saved['model']))}, ...): resume into the plain model, no wrapper")
        if differ := [k for k, v in saved["model"].items() if not torch.equal(weights[k], v)]:
            return (f"{len(differ)} of {len(weights)} weights differ from the {nprocs} ranks' ({differ[0]} first): "
                    f"dcp.load into the state dict, then set_state_dict(model, optimizer, ...)")
        state = get_state_dict(model, optimizer)[1]["state"]
        if any(k not in state or not torch.equal(state[k]["exp_avg"], v) for k, v in saved["exp_avg"].items()):
            return ("the weights match, the optimizer's state does not (AdamW's exp_avg): load the optimizer too, "
                    "get_state_dict(model, optimizer) before dcp.load and set_state_dict after it")
        return None

    verdict(mistake(), f"1 process resumed what {nprocs} ranks saved: {len(weights)} weights and AdamW's moments "
                       f"equal, bit for bit")


def main() -> None:
    """One compiled DDP step of :class:`MLP` a rank: ``TORCH_LOGS=ddp_graphs torchrun --standalone
    --nproc_per_node=2 -m workshop_lib.checks.beyond`` shows the split."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    try:
        model = MLP()
        model.compile(backend="aot_eager")
        model = DDP(model, bucket_cap_mb=1)
        F.binary_cross_entropy_with_logits(model(torch.randn(8, 512)), torch.ones(8, 1)).backward()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
