"""The shipped B3DB table, package data: ``workshop_lib.dataset`` installed (pyproject.toml maps it here)."""
