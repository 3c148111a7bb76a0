"""The checks a notebook calls, one module per notebook (or per lab): ``group`` (01), ``sampler`` (02), ``ddp``
(03), ``patterns`` and ``nodes`` (04a), ``by_hand`` (04b), ``hang_labs`` and ``hang_runs`` (05), ``beyond`` (06).
Each runs the learner's own code through :mod:`workshop_lib.engine`."""
