"""``python -m workshop_lib.watch`` without its last line (gc.freeze): the baseline of benchmarks/watch_exit.py."""

from workshop_lib.watch import main

if __name__ == "__main__":
    main()
