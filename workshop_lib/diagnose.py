"""The command ``python -m workshop_lib.diagnose``: every rank's stack (:mod:`workshop_lib.debug.stacks`)."""

if __name__ == "__main__":
    from workshop_lib.cli import run_cli
    from workshop_lib.debug.stacks import main

    raise SystemExit(run_cli(main))
