"""The hang watch's per-rank side (:class:`Watch`): its daemon thread, and the diagnosis.

:mod:`workshop_lib.debug.hangwatch` starts and stops it. It reads the rank's record of calls
(:class:`~workshop_lib.debug.collectives.Record`, which the checker's recorder shares) and is told each call that ends
(``ended``); the thread answers the other ranks through its own client of the rendezvous store and, when a collective
waits too long, prints one block (:mod:`workshop_lib.debug.hangreport`), then one short line each time the wait
doubles (:func:`report_at`), until the call ends or the group's timeout fails it.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_nccl_timeout, default_pg_timeout

from workshop_lib.debug import collectives, hangreport
from workshop_lib.debug.collectives import called, user_frames
from workshop_lib.debug.hangreport import PREFIX, explain
from workshop_lib.debug.launchenv import read_launch_env
from workshop_lib.errors import first_line, first_sentence

WARNING = "hangwatch warning: "  # starts the one line the watch prints when it fails (not part of a block)
LEFT = 2**62  # the "asked" number of a rank's answer once it has left: it answers every question
CONNECT_TIMEOUT = timedelta(seconds=30)
AFTER = 60.0  # the longest default threshold (s): a learner's job without --after hears of a wait within a minute


_warned = False


def warn(text: str) -> None:
    """The watch's one warning line on stderr (once per process): it failed, and the job runs on unwatched."""
    global _warned
    if not _warned:
        _warned = True
        print(f"{WARNING}{text}", file=sys.stderr, flush=True)


def store_gone(err: BaseException) -> bool:
    """The expected failure: the rendezvous store's host (rank 0 or torchrun's agent) has ended."""
    return isinstance(err, dist.DistNetworkError)


def group_timeout(timeout: timedelta | None = None) -> timedelta:
    """``timeout``, else torch's documented default for the group's backend: 10 min for nccl and 30 min for the others
    (:mod:`torch.distributed.constants`)."""
    if timeout is None:
        nccl = dist.is_initialized() and "nccl" in str(dist.get_backend())
        timeout = (nccl and default_pg_nccl_timeout) or default_pg_timeout  # the former is None without NCCL
    return timeout


def default_threshold(timeout: timedelta | None = None) -> float:
    """A quarter of the group's ``timeout``, at least 5 s and at most :data:`AFTER` (a minute): with torch's default
    timeouts (None: the script passed none, or it was not seen, the watch attached after the group was made), a
    minute; with a short one, a report still comes before the timeout ends the wait (:func:`group_timeout`)."""
    return min(AFTER, max(5.0, group_timeout(timeout).total_seconds() / 4))


def report_at(threshold: float, n: int) -> float:
    """How long a call has waited at the watch's report number ``n`` on it (0: the full block, then one line each
    time the wait doubles): ``threshold``, then 2, 4, 8 ... times it (1, 2, 4, 8 min by default)."""
    return threshold * 2**n


def duration(seconds: float) -> str:
    """'45 s', '2 min': how long a call has waited, as a report says it."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


class Watch:
    """The per-rank state and its daemon thread; see :func:`~workshop_lib.debug.hangwatch.attach` and ``install``."""

    def __init__(self, threshold: float | None, poll: float, record: str | None, store: dist.Store | None = None,
                 prefix: str = "hangwatch"):
        self.given, self.prefix = store, prefix  # install's store; attach connects to torchrun's itself
        self.threshold, self.poll = threshold, poll
        self.own_threshold = threshold is None  # nobody chose it: the full block says what a report means
        self.calls = collectives.Record()  # the rank's record of calls, which it reads (its own until started)
        self.record = record or os.environ.get(hangreport.RECORD_VARIABLE) or None  # where the block is saved too
        self.rank, self.world_size = -1, 0  # known once the group exists
        self.main_store: dist.Store | None = None  # the main thread's connection (a failed collective asks)
        self.thread_store: dist.Store | None = None  # the thread's own: never shares a socket with the main thread
        self.hosts_store = False  # rank 0 hosts the rendezvous store (no agent store): it waits for the others
        self.queued: collections.deque = collections.deque(maxlen=collectives.HISTORY)  # (call, CUDA event) unfinished
        self.reported: set = set()  # (name, seq, t) of the waits already explained
        self.again: tuple[tuple, int] | None = None  # (the wait this rank explained, its next report's number)
        self.main = threading.main_thread().ident
        self.stop = threading.Event()
        self.joined = threading.Event()  # the group exists and the stores are connected
        self.lock, self.join_lock = threading.Lock(), threading.Lock()
        self.answered, self.left, self.said_left = 0, False, False
        self.thread = threading.Thread(target=self._run, name="hangwatch", daemon=True)

    # --------------------------------------------------------------- the main thread's side: a follower of the
    # rank's record of calls, told each call that ends
    @property
    def saw_group(self) -> bool:
        """Whether the record saw init_process_group called: the group's timeout is known."""
        return collectives.INIT in self.calls.latest

    @property
    def group_timeout(self) -> timedelta | None:
        """The timeout the script gave init_process_group, where the record saw it (else None)."""
        seconds = self.calls.latest.get(collectives.INIT, {}).get("timeout")
        return timedelta(seconds=seconds) if isinstance(seconds, float) else None

    def ended(self, call: dict, err: BaseException | None) -> None:
        if call["kind"] == "init":
            if err is None:
                self.join()  # the group exists: connect now, not up to a poll later
            return
        if call.get("device") == "cuda" and err is None:
            # NCCL returns as soon as the collective is queued; an event after it tells when the GPU got through.
            event = torch.cuda.Event()
            event.record()
            self.queued.append((call, event))
        if err is not None and not isinstance(err, KeyboardInterrupt) and self.joined.is_set():
            self.explain(call, f"failed after {time.time() - call['t']:.0f} s ({first_sentence(err)})")

    def failed(self, err: BaseException) -> None:
        """Called when this watch raised (its thread, or told of a call by the record): stop, in one line."""
        self.stop.set()
        warn(f"stopped watching{f' rank {self.rank}' if self.rank >= 0 else ''} ({type(err).__name__}: "
             f"{first_line(err)}); the job runs on unwatched")

    # --------------------------------------------------------------- the daemon thread
    def _run(self) -> None:
        try:
            while not dist.is_initialized():  # attach: the script has not joined yet
                if self.stop.wait(self.poll):
                    return
            self.join()
            if self.world_size > 1:
                self._serve()
        except Exception as err:  # the watch must never stop the job: it says so, once
            if not store_gone(err):  # the store's host ended first (the job is ending): nothing to say
                self.failed(err)

    def join(self) -> None:
        """The group exists: who we are, the threshold, and two connections to the rendezvous store (once)."""
        with self.join_lock:
            if self.world_size == 0:
                self._join()

    def _join(self) -> None:
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        if self.threshold is None:
            self.threshold = default_threshold(self.group_timeout)
        if self.world_size < 2:
            return
        if self.given is not None:
            base = dist.PrefixStore(self.prefix, self.given)
            self.main_store, self.thread_store = base.clone(), base.clone()
        else:
            launch = read_launch_env()
            if "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
                raise RuntimeError("MASTER_ADDR and MASTER_PORT are not set: the watch talks through the rendezvous "
                                   "store of env:// (torchrun's)")
            # Without torchrun's agent store, env:// started the store's server in rank 0, as a multi-tenant
            # TCPStore, and destroy_process_group would stop it: there the watch joins it as a tenant (the same
            # server, kept up while the watch lives), so that the ranks still leaving can say so.
            self.hosts_store = self.rank == 0 and not launch.agent_store
            try:
                self.main_store, self.thread_store = (
                    dist.PrefixStore(self.prefix, dist.TCPStore(
                        launch.master_addr, launch.master_port, is_master=self.hosts_store, timeout=CONNECT_TIMEOUT,
                        wait_for_workers=False, multi_tenant=self.hosts_store))
                    for _ in range(2))
            except dist.DistNetworkError as err:
                raise RuntimeError(f"cannot reach the rendezvous store at {launch.master_addr}:{launch.master_port}"
                                   f" ({first_line(err)})") from None
        self.joined.set()

    def _serve(self) -> None:
        store = self.thread_store
        while not self.stop.wait(self.poll):
            if not dist.is_initialized():  # the script called destroy_process_group
                self.say_left(store)
                return
            asked = store.add("ask", 0)
            if asked > self.answered:
                self.answered = asked
                store.set(f"where/{self.rank}", self.where(asked))
            call = self.calls.current or self.unfinished_on_gpu()
            if call is not None:
                self.speak(call, time.time(), store)

    def speak(self, call: dict, now: float, store: dist.Store | None = None) -> None:
        """Report ``call``'s wait once it has lasted the threshold (the full block, from one rank), then one line
        from that rank each time the wait doubles (:func:`report_at`)."""
        waited = now - call["t"]
        if waited <= self.threshold:
            return
        key = (call["name"], call.get("seq"), call["t"])
        if key not in self.reported:
            on_gpu = " for the GPU to finish it" if call is not self.calls.current else ""
            self.explain(call, f"has waited {waited:.0f} s{on_gpu}", store, note=self.note())
        elif self.again and self.again[0] == key and waited >= report_at(self.threshold, self.again[1]):
            self.again = (key, self.again[1] + 1)
            timeout = f", of the process group's {duration(self.timeout())} timeout" if self.timeout() else ""
            print(f"{PREFIX}rank {self.rank} still waits in {called(call)}, called at {call['where']}: "
                  f"{duration(waited)} so far{timeout}",
                  file=sys.stderr, flush=True)

    def timeout(self) -> float | None:
        """The group's timeout (s), where the watch saw the group made (else unknown: None)."""
        return group_timeout(self.group_timeout).total_seconds() if self.saw_group else None

    def note(self) -> str | None:
        """What a report means, for a learner who chose no threshold: None where a tool or the learner chose one."""
        if not self.own_threshold:
            return None
        timeout = self.timeout()
        again = [report_at(self.threshold, n) for n in (1, 2, 3, 4) if not timeout or report_at(self.threshold, n) < timeout]
        later = ", ".join(map(duration, again[:3])) + (" ..." if len(again) > 3 else "")  # none after the timeout
        return (f"a report, not a failure: the call may still complete (a rank that is only slow) or wait until the "
                f"process group's timeout{f' ({duration(timeout)})' if timeout else ''} makes it fail" +
                (f"; the watch reports again at {later}" if again else ""))

    def unfinished_on_gpu(self) -> dict | None:
        """The oldest collective queued on the GPU that has not finished there (NCCL), if any."""
        while self.queued and self.queued[0][1].query():
            self.queued.popleft()
        return self.queued[0][0] if self.queued else None

    def where(self, asked: int) -> str:
        """This rank's answer, as JSON: its main thread's stack, and its record's calls (the one it is in, the last
        numbered one, the counts by name, the latest :data:`~workshop_lib.debug.collectives.HISTORY`)."""
        frame = sys._current_frames().get(self.main)
        found, inner = user_frames(frame) if frame is not None and not self.left else ([], "")
        return json.dumps({"rank": self.rank, "asked": asked, "pid": os.getpid(), "frames": found, "inner": inner,
                           "current": self.calls.current or self.unfinished_on_gpu(), "left": self.left,
                           "last": self.calls.last(), "counts": self.calls.counts(),
                           "history": list(self.calls.recent)}, default=str)

    def say_left(self, store: dist.Store | None) -> None:
        """This rank has left the job: its last answer says so, so a rank still waiting can name it."""
        self.left = True
        if store is not None and not self.said_left:
            self.said_left = True
            store.set(f"where/{self.rank}", self.where(LEFT))

    def others_left(self, seconds: float) -> None:
        """Rank 0, host of the store: wait (at most ``seconds``) until every other rank has said it left (else a rank
        still leaving would find the store gone, and torch would print its socket errors)."""
        deadline, waiting = time.monotonic() + seconds, set(range(1, self.world_size))
        while True:
            for r in list(waiting):
                if self.main_store.check([f"where/{r}"]) and \
                        json.loads(self.main_store.get(f"where/{r}"))["asked"] == LEFT:
                    waiting.discard(r)
            if not waiting or time.monotonic() >= deadline:
                return
            time.sleep(0.02)

    # --------------------------------------------------------------- the diagnosis
    def explain(self, call: dict, how: str, store: dist.Store | None = None, note: str | None = None) -> None:
        """Ask every rank where it is, and print the diagnosis of ``call`` once (``note``: what a report means)."""
        key = (call["name"], call.get("seq"), call["t"])
        with self.lock:
            if key in self.reported:
                return
            self.reported.add(key)
        store = store or self.main_store
        answers: dict[int, dict] = {}
        try:
            if store.add("reports", 1) > 1 and (not store.check(["reported_at"]) or
                                                 time.time() - float(store.get("reported_at")) < 4 * self.threshold):
                return  # another rank is explaining this hang, or just did: one block is enough
            store.set("reported_at", str(time.time()))
            asked = store.add("ask", 1)
            store.set(f"where/{self.rank}", self.where(asked))
            deadline = time.time() + 3 * self.poll + 1.0
            while True:
                for r in range(self.world_size):
                    if r not in answers and store.check([f"where/{r}"]):
                        answer = json.loads(store.get(f"where/{r}"))
                        if answer["asked"] >= asked:
                            answers[r] = answer
                if len(answers) == self.world_size or time.time() >= deadline:
                    break
                time.sleep(0.05)
        except dist.DistNetworkError:
            pass  # the store's host is gone (rank 0 crashed, say): the block says who did not answer
        report = explain(self.rank, call, how, answers, self.world_size, note)
        self.again = (key, 1)  # this rank explained the wait: it says when the wait doubles
        print("\n".join(PREFIX + line for line in report["block"]), file=sys.stderr, flush=True)
        if self.record is not None:  # the same block for programs to load, instead of scraping the rank's output
            try:
                hangreport.save(self.record, report, left=[r for r, a in answers.items() if a.get("left")],
                                answers=answers)
            except OSError as err:
                warn(f"could not save the hang record to {self.record} ({type(err).__name__}: {first_line(err)})")
