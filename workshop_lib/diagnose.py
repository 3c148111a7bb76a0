"""The command ``python -m workshop_lib.diagnose``: every rank's stack (:mod:`workshop_lib.debug.stacks`)."""

if __name__ == "__main__":
    from workshop_lib.debug.stacks import main
    from workshop_lib.lab.cli import run_cli

    raise SystemExit(run_cli(main))
