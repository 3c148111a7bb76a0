"""The command ``python -m workshop_lib.check``: the script checker (:mod:`workshop_lib.checks.script`)."""

if __name__ == "__main__":
    from workshop_lib.checks.script import _exit_with_verdict
    from workshop_lib.lab.cli import run_cli

    raise SystemExit(run_cli(_exit_with_verdict))
