"""Torch's own error, when a learner's DDP line causes it, to the cause and the fix: one table, :data:`KNOWN`.

Each pattern is matched against torch's whole message; the tests raise each error from torch itself, so a release
that rewords one shows. Where the line that raised is not the one that set the error up, :data:`SET_UP` names the
recorded call that did (the rules read its line from the record)."""

from __future__ import annotations

import re

# a batch of items of different lengths, stacked by default_collate: raised in the loop, set up by the DataLoader
_UNEQUAL_ITEMS = re.compile(r"stack expects each tensor to be equal size|each element in list of batch should be of "
                            r"equal size")

KNOWN: tuple[tuple[re.Pattern, str], ...] = (
    (re.compile(r"(?<!'NoneType') object has no attribute 'module'"),  # None: a name left unset (branches)
     "`.module` is the model inside DDP's wrapper, and this model was never wrapped: wrap it with DDP(model) first, "
     "or use the model itself where there is no wrapper"),
    (re.compile(r"Expected timeout argument to be of type datetime\.timedelta"),
     "init_process_group's timeout is a datetime.timedelta, not a number: timeout=timedelta(seconds=...)"),
    (re.compile(r"sampler option is mutually exclusive with shuffle"),
     "a DataLoader given a sampler takes no shuffle=: the DistributedSampler shuffles (its own shuffle=True, the "
     "default); leave shuffle out of the DataLoader"),
    (re.compile(r'Unexpected key\(s\) in state_dict: "module\.'),
     "these weights were saved from DDP's wrapper (every key starts with module.): save model.module.state_dict(), "
     "the plain model's, so that any script can load it"),
    (re.compile(r'Missing key\(s\) in state_dict: "module\.'),
     "a plain model's weights loaded into DDP's wrapper, whose keys start with module.: load into model.module"),
    (re.compile(r"Expected to have finished reduction in the prior iteration"),
     "a parameter took no part in the last step's loss, so DDP still waits for its gradient: use every parameter "
     "in the forward, or pass find_unused_parameters=True to DDP"),
    (re.compile(r"device_ids and output_device arguments only work with"),
     "device_ids names a GPU, and this model is on the CPU: give DDP no device_ids on CPU, [local_rank] on a GPU"),
    (re.compile(r"(?<!'NoneType') object has no attribute 'set_epoch'"),
     "set_epoch belongs to the DistributedSampler, and this loader draws from another sampler: give the DataLoader "
     "sampler=DistributedSampler(dataset)"),
    (re.compile(r"Default process group has not been initialized"),
     "a dist call came before the process group existed: call dist.init_process_group(backend) first, in setup"),
    (re.compile(r"Distributed package doesn't have NCCL built in|ProcessGroupNCCL is only supported with GPUs|"
                r"nccl2? requires at least one CUDA device"),  # a CPU build; a CUDA build without GPUs (2.15)
     "nccl needs GPUs: use gloo on CPU (dist.get_default_backend_for_device picks it)"),
    (re.compile(r"Torch not compiled with CUDA enabled|has no attribute '_cuda_|No CUDA GPUs are available|"
                r"Found no NVIDIA driver"),  # a CPU build (a CUDA call, or its C function absent); a CUDA build
     "this machine has no GPU: call CUDA only where torch.cuda.is_available() (on the CPU: device cpu, backend gloo)"),
    (re.compile(r"Cannot re-initialize CUDA in forked subprocess"),  # the parent started CUDA, or tried (no GPU)
     "this rank was forked from a process that had started CUDA, or tried to where there is no GPU, and CUDA cannot "
     "start again in a forked child: call CUDA only where torch.cuda.is_available(), and start ranks that use GPUs "
     "fresh (torchrun, or the spawn start method)"),
    (re.compile(r"device_id parameter must be (?:an accelerator with an index|a device with a valid index)"),  # 2.13|2.15
     "device_id binds the group to this process's GPU, and the device given is the CPU: pass device_id only on a "
     "GPU (device_id=device where device.type == \"cuda\"), and leave it out with gloo on CPU"),
    (_UNEQUAL_ITEMS,
     "the DataLoader has no collate_fn, so torch's default_collate stacks the items as they are, and they differ in "
     "length: give it collate_fn=, a function that pads each batch (the workshop's collate, or your own with "
     "torch.nn.utils.rnn.pad_sequence)"),
)

# torch's error -> the kind of recorded event whose call set it up, when that is not the line that raised
SET_UP: tuple[tuple[re.Pattern, str], ...] = ((_UNEQUAL_ITEMS, "loader"),)


def set_up_by(message: str) -> str | None:
    """The kind of recorded event (:data:`SET_UP`) whose call set torch's ``message`` up; None: the line that raised."""
    return next((kind for pattern, kind in SET_UP if pattern.search(message or "")), None)


def explain(message: str) -> str | None:
    """The cause and the fix of torch's ``message``, where it is one of :data:`KNOWN`; else None."""
    return next((why for pattern, why in KNOWN if pattern.search(message or "")), None)
