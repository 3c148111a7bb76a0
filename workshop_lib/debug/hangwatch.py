"""Where is every rank when a collective hangs? A watch that answers, on gloo and nccl alike.

A collective returns only when every rank of the group has entered it. When
one rank never does (it skipped it, it is somewhere else, it died), the others
wait until the process group's timeout and then fail with a message about
sockets. :func:`install` makes the wait legible:

* each rank records the collective it is in and the last one it finished (the
  op, its tensors' shapes and dtypes, and a per-rank sequence number) by wrapping
  ``torch.distributed``'s Python collectives (``dist.all_reduce`` ...);
  DDP's gradient all-reduce runs in C++ inside ``loss.backward()``, so for it
  the watch notices a backward that does not return;
* a daemon thread on each rank answers questions through the rendezvous store
  (a TCP store, independent of the gloo or nccl connections that are stuck);
* when a rank has waited ``threshold`` seconds, or its collective fails, it asks
  every rank where it is (its main thread's Python stack, from
  ``sys._current_frames``) and prints one block (:mod:`workshop_lib.debug.hangreport`):
  who never arrived, where each rank is instead, and the first collective where
  the ranks' sequences differ.

On CUDA tensors (NCCL) a collective returns once it is queued on the GPU; the
watch records a CUDA event after it, and a collective whose event has not
completed within ``threshold`` is reported as waiting on the GPU.

It also registers ``faulthandler`` on SIGUSR1 (``kill -USR1 PID`` dumps every
thread's stack to the rank's stderr) for ``python -m workshop_lib.diagnose``.
A job that does not hang pays one store round-trip per ``poll`` seconds on a
side thread and a few microseconds per wrapped Python collective.
"""

from __future__ import annotations

import collections
import contextlib
import faulthandler
import functools
import json
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from workshop_lib.debug import collectives, frames, hangreport
from workshop_lib.debug.hangreport import PREFIX, RECORD_VARIABLE, explain
from workshop_lib.debug.patching import patched
from workshop_lib.errors import first_sentence

HISTORY = 64  # collectives each rank remembers, to find the first one where the ranks differ
LEFT = 2**62  # the "asked" number of a rank's answer once it has left: it answers every question


@dataclass
class Call:
    """One collective as this rank entered it."""

    op: str  # "all_reduce", "backward" (DDP's C++ all-reduce), ...
    seq: int  # this rank's count of wrapped collectives, 1-based; 0 for backward
    tensors: str  # "float32[3]", "2 tensors", ...
    since: float  # time.time() when it was entered
    where: str  # "file.py:41 in train()", the caller outside torch
    gpu: bool = False  # on CUDA tensors: Python returns once it is queued; the GPU may still wait
    backwards: int = 0  # the backward() calls this rank had entered by then (a backward's own number)

    def name(self) -> str:
        return "loss.backward()" if self.op == "backward" else f"{self.op} #{self.seq}"


def _on_gpu(args: tuple, kwargs: dict) -> bool:
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor) or (isinstance(a, list | tuple) and a and isinstance(a[0], torch.Tensor)):
            return (a if isinstance(a, torch.Tensor) else a[0]).is_cuda
    return False


def _tensors(args: tuple, kwargs: dict) -> str:
    found = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor | list | tuple)]
    for a in found:
        if isinstance(a, torch.Tensor):
            return f"{str(a.dtype).removeprefix('torch.')}{list(a.shape)}"
        if a and all(isinstance(t, torch.Tensor) for t in a):
            return f"{len(a)} tensors, first {str(a[0].dtype).removeprefix('torch.')}{list(a[0].shape)}"
    return "no tensor"


def user_frames(frame) -> tuple[list[list], str]:
    """([file, line, function, code] of the learner's frames, outermost first; the innermost library function)."""
    stack = frames.since_fork(traceback.extract_stack(frame))
    inner = stack[-1].name if stack and frames.is_library(stack[-1].filename) else ""
    return [[frames.short(f.filename), f.lineno, f.name, (f.line or "").strip()] for f in frames.users(stack)], inner


def _caller() -> str:
    """'f.py:25 in g()', and where g was called from, for the code that called the collective."""
    mine, _ = user_frames(sys._getframe(2))
    sites = [f"{f}:{n} in {fn}()" for f, n, fn, _ in mine[-2:]]
    return ", from ".join(reversed(sites)) or "?"


class Watch:
    """The per-rank state and its daemon thread; see :func:`install`."""

    def __init__(self, store: dist.Store, rank: int, world_size: int, threshold: float, poll: float,
                 record: str | None = None):
        self.store, self.rank, self.world_size, self.record = store, rank, world_size, record
        self.threshold, self.poll = threshold, poll
        self.seq, self.current, self.last = 0, None, None
        self.backwards = 0  # backward() calls entered: under DDP, one gradient all-reduce each
        self.history: collections.deque = collections.deque(maxlen=HISTORY)  # the last collectives entered
        self.queued: collections.deque = collections.deque(maxlen=HISTORY)  # (Call, CUDA event) not known finished
        self.reported: set = set()  # (op, seq, since) of the waits already explained
        self.main = threading.main_thread().ident
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.answered = 0
        # Connections made now, while the store is surely up: opening one later, when the rank that hosts the
        # store may be gone, would retry for the store's whole timeout.
        self.main_store, self.thread_store = store.clone(), store.clone()
        self.thread = threading.Thread(target=self._run, name="hangwatch", daemon=True)

    # --------------------------------------------------------------- the main thread's side (an observer of
    # workshop_lib.debug.collectives: enter and leave run around every collective)
    def enter(self, op: str, args: tuple, kwargs: dict) -> Call | None:
        if threading.get_ident() != self.main:
            return None
        gpu = _on_gpu(args, kwargs)
        if op == "backward":  # not a collective of its own: DDP's all-reduces run inside it, in C++
            self.backwards += 1
            self.current = Call(op, 0, "DDP's gradient buckets", time.time(), _caller(), gpu, self.backwards)
        else:
            self.seq += 1
            self.current = Call(op, self.seq, _tensors(args, kwargs), time.time(), _caller(), gpu, self.backwards)
            self.history.append(self.current)
        return self.current

    def leave(self, call: Call | None, err: BaseException | None) -> None:
        if call is None:
            return
        self.current = None
        if call.gpu and err is None:
            # NCCL returns as soon as the collective is queued; an event after it tells when the GPU got through.
            event = torch.cuda.Event()
            event.record()
            self.queued.append((call, event))
        if call.op != "backward":
            self.last = call
        if err is not None and not isinstance(err, KeyboardInterrupt):
            self.explain(call, f"failed after {time.time() - call.since:.0f} s ({first_sentence(err)})")

    # --------------------------------------------------------------- the daemon thread
    def _run(self) -> None:
        store = self.thread_store  # its own connection: never shares a socket with the main thread
        while not self.stop.wait(self.poll):
            with contextlib.suppress(Exception):  # a store gone (job ending) must not print tracebacks
                asked = store.add("ask", 0)
                if asked > self.answered:
                    self.answered = asked
                    store.set(f"where/{self.rank}", self.where(asked))
                call = self.current or self.unfinished_on_gpu()
                if call is not None and time.time() - call.since > self.threshold:
                    on_gpu = " for the GPU to finish it" if call is not self.current else ""
                    self.explain(call, f"has waited {time.time() - call.since:.0f} s{on_gpu}", store)

    def unfinished_on_gpu(self) -> Call | None:
        """The oldest collective queued on the GPU that has not finished there (NCCL), if any."""
        while self.queued and self.queued[0][1].query():
            self.queued.popleft()
        return self.queued[0][0] if self.queued else None

    def where(self, asked: int, left: bool = False) -> str:
        """This rank's answer: its main thread's stack and collectives, as JSON."""
        frame = sys._current_frames().get(self.main)
        frames, inner = user_frames(frame) if frame is not None else ([], "")
        call = self.current or self.unfinished_on_gpu()
        return json.dumps({"rank": self.rank, "asked": asked, "pid": os.getpid(), "frames": frames, "inner": inner,
                           "current": asdict(call) if call else None, "left": left,
                           "last": asdict(self.last) if self.last else None, "backwards": self.backwards,
                           "history": [asdict(c) for c in self.history]})

    def leave_job(self) -> None:
        """Before destroy_process_group: leave a last answer, so a rank still waiting can say this one left."""
        with contextlib.suppress(Exception):
            self.main_store.set(f"where/{self.rank}", self.where(LEFT, left=True))

    # --------------------------------------------------------------- the diagnosis
    def explain(self, call: Call, how: str, store: dist.Store | None = None) -> None:
        """Ask every rank where it is, and print the diagnosis of ``call`` once."""
        key = (call.op, call.seq, call.since)
        with self.lock:
            if key in self.reported:
                return
            self.reported.add(key)
        store = store or self.main_store
        answers: dict[int, dict] = {}
        with contextlib.suppress(Exception):
            if store.add("reports", 1) > 1 and (not store.check(["reported_at"]) or
                                                 time.time() - float(store.get("reported_at")) < 4 * self.threshold):
                return  # another rank is explaining this hang, or just did: one block is enough
            store.set("reported_at", str(time.time()))
            asked = store.add("ask", 1)
            store.set(f"where/{self.rank}", self.where(asked))
            deadline = time.time() + 3 * self.poll + 1.0
            while len(answers) < self.world_size and time.time() < deadline:
                for r in range(self.world_size):
                    if r not in answers and store.check([f"where/{r}"]):
                        answer = json.loads(store.get(f"where/{r}"))
                        if answer["asked"] >= asked:
                            answers[r] = answer
                time.sleep(0.05)
        lines = explain(self.rank, call, how, answers, self.world_size)
        print("\n".join(PREFIX + line for line in lines), file=sys.stderr, flush=True)
        if self.record is not None:  # the same block for programs to load, instead of scraping the rank's output
            hangreport.save(self.record, self.rank, lines, left=[r for r, a in answers.items() if a.get("left")],
                            answers=answers)


_watch: Watch | None = None
_patches: contextlib.ExitStack | None = None  # destroy_process_group's wrapper


def _default_store() -> dist.Store:
    """A client of the rendezvous store of the default process group (torchrun's, or the one passed in)."""
    return dist.distributed_c10d._get_default_store()


def _group_timeout() -> float:
    """The default process group's timeout in seconds (torch's default, 30 min, if it cannot be read)."""
    group = dist.distributed_c10d._get_default_group()
    for device in ("cpu", "cuda"):
        with contextlib.suppress(Exception):
            return group._get_backend(torch.device(device)).options._timeout.total_seconds()
    return 1800.0


def install(store: dist.Store | None = None, threshold: float | None = None, poll: float = 0.5,
            record: str | None = None) -> Watch | None:
    """Watch this rank's collectives; call it after ``init_process_group``, on every rank.

    ``store``: the rendezvous store (default: the default group's). ``threshold``:
    seconds a collective may wait before the diagnosis is printed (default: a quarter
    of the group's timeout, at least 5). ``record``: a JSON file where the diagnosis
    is also saved (:func:`workshop_lib.debug.hangreport.load` reads it; default: the
    environment's ``WORKSHOP_HANG_RECORD``, which the lab's launchers set, else none).
    Does nothing in a world of one. Safe to call twice; :func:`uninstall` (or
    ``dist.destroy_process_group``) undoes it.
    """
    global _watch, _patches
    if not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    uninstall()
    if threshold is None:
        threshold = max(5.0, _group_timeout() / 4)
    store = dist.PrefixStore("hangwatch", store or _default_store())
    record = record or os.environ.get(RECORD_VARIABLE) or None
    _watch = Watch(store, dist.get_rank(), dist.get_world_size(), threshold, poll, record)
    collectives.add(_watch)
    _patches = contextlib.ExitStack()
    _patches.enter_context(patched(dist, "destroy_process_group", _uninstalling))
    if hasattr(signal, "SIGUSR1") and threading.current_thread() is threading.main_thread():
        faulthandler.register(signal.SIGUSR1, all_threads=True)  # kill -USR1 PID: every thread's stack to stderr
    _watch.thread.start()
    return _watch


def _uninstalling(destroy):
    @functools.wraps(destroy)
    def destroy_process_group(*args, **kwargs):
        if not args and not kwargs.get("group"):
            if _watch is not None:
                _watch.leave_job()
            uninstall()
        return destroy(*args, **kwargs)

    return destroy_process_group


def uninstall() -> None:
    """Stop the watch and put torch.distributed's functions back."""
    global _watch, _patches
    watch, _watch = _watch, None
    patches, _patches = _patches, None
    if patches is not None:
        patches.close()
    if watch is not None:
        collectives.remove(watch)
        watch.stop.set()
        if watch.thread.is_alive() and watch.thread is not threading.current_thread():
            watch.thread.join(timeout=2 * watch.poll + 1)
