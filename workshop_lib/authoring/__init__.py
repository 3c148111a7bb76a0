"""The notebooks as the single source: a cell's solution and exercise spans (``spans``), and the step scripts written
from the cells (``scripts``: ``write_script``)."""
