"""The command ``python -m workshop_lib.site``: the lesson site, built from docs/ (:mod:`workshop_lib.lab.site`)."""

if __name__ == "__main__":
    from workshop_lib.lab.cli import run_cli
    from workshop_lib.lab.site import main

    raise SystemExit(run_cli(main))
