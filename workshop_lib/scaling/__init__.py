"""The scaling model: what a step costs on N ranks (``cost``), its inputs measured here (``measure``), and sliders
(``explorer``)."""
