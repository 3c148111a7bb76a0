"""The command ``python -m workshop_lib.selftest``: is this machine ready for the lab? (:mod:`workshop_lib.lab.selftest`)."""

if __name__ == "__main__":
    from workshop_lib.lab.cli import run_cli
    from workshop_lib.lab.selftest import main

    raise SystemExit(run_cli(main))
