"""Hang debugging: the watch that names the rank a collective waits for, its report, and every rank's stack.

Nothing here runs unless a script asks for it: a step script installs the watch
with one visible line in its ``main`` (``hangwatch.install(store)``).
"""
