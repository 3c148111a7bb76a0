"""errors.first_line and first_sentence: the one way to shorten an error to a line."""


from __future__ import annotations

import pytest

from workshop_lib.errors import first_line, first_sentence


@pytest.mark.parametrize(("err", "line", "sentence"), [
    (RuntimeError("[../gloo/transport.cc:1] Connection closed by peer. More text\nsecond line"),
     "[../gloo/transport.cc:1] Connection closed by peer. More text", "Connection closed by peer"),
    (KeyError(), "KeyError", "KeyError"),
    ("  plain text\nnext", "plain text", "plain text"),
])
def test_first_line_and_first_sentence(err, line, sentence):
    assert first_line(err) == line and first_sentence(err) == sentence


def test_first_line_is_cut_to_its_limit():
    assert first_line(ValueError("x" * 500), 300) == "x" * 300
