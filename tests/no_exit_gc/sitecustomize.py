"""Every Python the test run starts skips the garbage collections of its own exit: ``gc.freeze()``, last of all.

``tests/conftest.py`` puts this folder on the ``PYTHONPATH`` of the run, so torchrun's agent, its ranks, the
scripts and the kernels of the run import it at start-up. It registers ``gc.freeze`` with atexit before
anything else can register a handler, so it runs after every handler of the program (atexit runs them last
registered, first run): what the program does at exit still happens. The interpreter's exit then leaves the
objects to the operating system instead of walking them all in several collections: about 0.5 s for a rank
that has imported torch and ``torch._dynamo`` (285,000 tracked objects), a few seconds per test that starts
processes. Only cyclic garbage goes unfinalized, which Python never promised to finalize at exit; the step
scripts close what they open themselves. ``python -m workshop_lib.watch`` does the same for a learner's runs.

A ``sitecustomize`` of the environment itself (a distribution's, say) still runs: it is found after this one.
"""

import atexit
import gc
import importlib.machinery
import importlib.util
import os
import sys

atexit.register(gc.freeze)

_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.machinery.PathFinder.find_spec(
    "sitecustomize", [p for p in sys.path if os.path.abspath(p or os.curdir) != _here])
if _spec is not None and _spec.loader is not None:
    _theirs = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_theirs)
