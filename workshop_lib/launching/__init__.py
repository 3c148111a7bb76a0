"""Starting ranks: a step script under torchrun from a cell (``launch``), a notebook's function on forked or spawned
ranks (``forklaunch``, through ``ranks``), how a rank joins (``joining``), and stopping what was started (``processes``)."""
