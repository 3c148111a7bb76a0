"""The checks: one module per notebook, each running the learner's own code; and the script checker (``script``),
which runs a step script on two ranks (``runner``, ``recorder``) and judges what it did (``rules``: a few invariants,
one table)."""
