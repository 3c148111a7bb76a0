"""The exercise checks and the script checker: record what each rank did, name the first mistake in one line.

One module per notebook (``baseline`` 00, ``group`` 01, ``sampler`` 02, ``ddp`` 03,
``patterns`` and ``nodes`` 04a, ``by_hand`` 04b, ``hang_labs`` 05), the script checker
(``script``), what every rank recorded (``record``, ``rank``) and the rules that read it (``rules``).
"""
