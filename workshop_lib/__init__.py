"""workshop_lib: the model, data and DDP machinery behind the workshop's step scripts.

Importing this package does no work: no data is read, no process group is made.
"""

__version__ = "1.0.0"
