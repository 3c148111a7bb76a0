"""The command ``python -m workshop_lib.build``: scripts and exercises from the notebooks (:mod:`workshop_lib.lab.build`)."""

if __name__ == "__main__":
    from workshop_lib.lab.build import main
    from workshop_lib.lab.cli import run_cli

    raise SystemExit(run_cli(main))
