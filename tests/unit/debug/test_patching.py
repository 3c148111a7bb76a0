"""The one patch helper: it restores, and leaves a later replacement alone."""


from __future__ import annotations

import os

import pytest

from workshop_lib.debug.patching import patched


class _Owner:
    value = "original"


def test_patched_restores_even_after_an_error():
    with pytest.raises(RuntimeError), patched(_Owner, "value", lambda old: f"{old}, patched"):
        assert _Owner.value == "original, patched"
        raise RuntimeError
    assert _Owner.value == "original"


def test_patched_leaves_a_later_replacement_in_place():
    with patched(_Owner, "value", lambda old: "mine"):
        _Owner.value = "theirs"
    assert _Owner.value == "theirs"
    _Owner.value = "original"


def test_patched_handles_mappings_and_missing_keys():
    names = {"kept": 1}
    with patched(names, "added", lambda old: ("was", old)), patched(os.environ, "WORKSHOP_TEST_VAR", lambda old: "x"):
        assert names["added"] == ("was", None) and os.environ["WORKSHOP_TEST_VAR"] == "x"
    assert names == {"kept": 1} and "WORKSHOP_TEST_VAR" not in os.environ
