"""The exercise checks and the script checker: judge what a run did, name the first mistake in one line.

One module per notebook (``baseline`` 00, ``group`` and ``made_up_rank`` 01, ``sampler`` 02, ``ddp`` 03, ``patterns``
and ``nodes`` 04a, ``by_hand`` 04b, ``hang_labs`` and ``hang_runs`` 05, ``beyond`` 06). The script checker
(``script``) runs a step script on two ranks (``runner``, ``rank``) with the observers of ``record`` attached from
outside (into a ``recorder.Recorder``), reads the measurements back (``events``) and judges them: how the run ended
(``rules``), what it did (``step_rules``, ``shards``), and for step 4 a resume (``resume``).
"""
