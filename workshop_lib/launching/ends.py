"""How each rank ended, as one record that verdicts read (never its text): :func:`record` in the rank; :func:`killed`
by the launcher for a rank that left none, :func:`waiting` for a hang, "timed out" past the launch's timeout;
:func:`summary` the one line that says any of them."""

from __future__ import annotations

import re
import signal
import time
import traceback
from pathlib import Path

from workshop_lib.errors import first_line

_FAULTHANDLER = re.compile(r"^Fatal Python error: ", re.MULTILINE)  # where faulthandler's dump of the stacks starts


def record(rank: int | None, err: BaseException | None, within: str | None = None) -> dict:
    """How rank ``rank``'s code ended: ``returned``; ``exit`` (a non-zero SystemExit: its ``code``); ``raised`` (its
    ``type``, ``detail``: torch's whole message, capped, where it names what it means). ``message``: the first line.
    ``file``, ``line``, ``function``: the learner's innermost frame (else the innermost; ``within`` a file: that
    file's, a script's own). ``frames``: the traceback's innermost, [file, line, function, code]."""
    from workshop_lib.debug import frames

    if err is None or (isinstance(err, SystemExit) and err.code in (None, 0)):
        return {"rank": rank, "how": "returned", "time": time.time()}
    stack = traceback.extract_tb(err.__traceback__)
    mine = [f for f in stack if f.filename == within] if within else frames.users(stack, core_is_library=True)
    at = mine[-1] if mine else None if within or not stack else stack[-1]  # a frame of no file: a cell of its own
    end = {"rank": rank, "how": "raised", "type": type(err).__name__, "message": first_line(err, 300),
           "detail": str(err)[:4000], "file": at and at.filename, "line": at and at.lineno,
           "function": at and at.name, "time": time.time(),
           "frames": [[f.filename, f.lineno, f.name, (f.line or "").strip()] for f in stack[-40:]]}
    if isinstance(err, SystemExit):
        code = err.code if isinstance(err.code, int) else 1
        end.update(how="exit", code=code, message=(getattr(err, "message", None) or str(err.code))[:300])
    return end


# Torch's words are the one source of these two: a rank whose collective raised because a peer went away (gloo's
# "Connection closed by peer", "Connection reset by peer"), or because the group's own timeout passed. Not the culprit.
_LOST = ("Connection closed", "Connection reset", "Broken pipe", "lost contact", "connection refused",
         "Connection refused", "ECONNRESET", "EPIPE", "peer", "Socket closed")
_TIMED_OUT = ("Timed out", "timed out", "Timeout", "timeout")


def how(end: dict | None) -> str:
    """The end record's own ``how`` ('returned', 'exit', 'raised', 'killed', 'waiting', 'timed out'); of a raise,
    where torch's words say so, 'lost' (a peer went away) or 'group timeout' (the group's timeout): an echo of
    another rank's failure; 'stopped' where the rank left no record at all."""
    if end is None:
        return "stopped"
    if end["how"] != "raised":
        return end["how"]
    message = end.get("message") or ""
    return "group timeout" if any(s in message for s in _TIMED_OUT) else \
        "lost" if any(s in message for s in _LOST) else "raised"


def culprits_first(found: list[dict]) -> list[dict]:
    """The ranks' ends, the first to fail first, an echo of another's failure (:func:`how`: lost, group timeout)
    after every other: the rank whose peer closed the connection is not the one to name."""
    return sorted(found, key=lambda end: (how(end) in ("lost", "group timeout"), end["time"], end["rank"]))


def killed(rank: int, code: int | None, log: Path) -> dict:
    """A rank that ended without a record (killed, aborted in C++, ``os._exit``): its exit code, the signal that
    ended it (a negative code), and the last lines of its ``log`` (:func:`last_lines`), at the time the log was last
    written (a peer's "Connection reset by peer" so comes after the death that caused it)."""
    when = log.stat().st_mtime if log.is_file() else time.time()
    try:
        died = signal.Signals(-code).name if code is not None and code < 0 else None
    except ValueError:
        died = f"signal {-code}"
    return {"rank": rank, "how": "killed", "code": code, "signal": died, "time": when,
            "detail": " | ".join(last_lines(log))}


def last_lines(log: Path) -> list[str]:
    """The last 3 lines a rank wrote to its ``log``, before faulthandler's dump of its stacks, if any."""
    output = log.read_text(errors="replace") if log.is_file() else ""
    return [line.strip() for line in _FAULTHANDLER.split(output, 1)[0].splitlines() if line.strip()][-3:]


def timed_out(rank: int) -> dict:
    """A rank that was still running when the launch's time was up."""
    return {"rank": rank, "how": "timed out", "time": time.time()}


def waiting(blocks: list[dict]) -> list[dict]:
    """Each rank's end in a hang, from the first block that the hang watch saved where a rank waits for another (else
    its first block): the call it waited in (None: in no collective), at its innermost frame of the learner's;
    ``frames``: the watch's frames of it, [file, line, function, code]; ``waited_for``: the ranks it waited for."""
    from workshop_lib.debug.collectives import called

    block = next((b for b in blocks if b["waiting_for"]), None) or next(iter(blocks), {"answers": {}})
    found = []
    for rank, answer in sorted(block["answers"].items(), key=lambda item: int(item[0])):
        call, (file, line, function, _) = answer.get("current") or {}, (answer.get("frames") or [[None] * 4])[-1]
        found.append({"rank": int(rank), "how": "waiting", "call": called(call) if call else None,
                      "file": file, "line": line, "function": function, "time": time.time(),
                      "frames": answer.get("frames") or [],
                      "waited_for": block.get("waiting_for", []) if int(rank) == block.get("rank") else []})
    return found


def summary(end: dict, by_line: bool = False, subject: str | None = None) -> str:
    """The one line of an end record: 'rank 1 raised ValueError: why (File "f", line 3, in g)', 'rank 0 exited with
    code 2: why', 'rank 1 died of SIGABRT (exit code -6) without a Python error; its last lines: ...'. ``by_line``: the
    reader has the file before them (a checked script's, a cell's), so its line alone, first: 'rank 1 raised
    ValueError (line 3): why'. ``subject``: who ran the code, where not the rank ('setup', a cell's function)."""
    who, how, code = subject or f"rank {end['rank']}", end["how"], end.get("code")
    at = f" (line {end['line']})" if by_line and end.get("line") else ""
    where = f' (File "{end["file"]}", line {end["line"]}, in {end["function"]})' if end.get("line") and not at else ""
    if how == "raised":
        return f"{who} raised {end['type']}{at}" + (f": {end['message']}" if end.get("message") else "") + where
    if how == "exit":
        return f"{who} exited with code {code}{at}: {end['message']}{where}"
    if how in ("waiting", "timed out"):
        return f"{who} " + (f"waited in {end['call']}" if end.get("call") else "was in no collective" if
                             how == "waiting" else "did not finish in time") + at + where
    died = (f"died of {end['signal']} (exit code {code})" if end.get("signal") else
            f"exited with code {code}" if code is not None else "ended")
    said = f"; its last lines: {end['detail']}" if end.get("detail") else "; it printed nothing"
    return f"{who} {died} without a Python error{said}"
