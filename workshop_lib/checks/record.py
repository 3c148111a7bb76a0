"""The recorder's old name, kept for :mod:`workshop_lib.checks.sampler`'s import: use :mod:`recorder`."""

from workshop_lib.checks.recorder import Recorder, recording  # noqa: F401
