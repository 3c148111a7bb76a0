"""Hang debugging: the watch that names the rank a collective waits for, its report, and every rank's stack.

Nothing here runs unless asked from outside the script: ``python -m workshop_lib.watch SCRIPT``
(or ``torchrun ... -m workshop_lib.watch SCRIPT``) attaches the watch (:func:`hangwatch.attach`),
and ``python -m workshop_lib.diagnose`` prints every rank's stack.
"""
