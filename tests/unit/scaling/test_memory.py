"""Memory per rank for DDP and FSDP: the bytes per parameter, and what sharding only the whole model still holds."""

from __future__ import annotations

import matplotlib
import pytest

from workshop_lib.scaling import memory

matplotlib.use("Agg")


def total(params, ranks, how, blocks=1):
    return sum(memory.per_rank(params, ranks, how, blocks).values())


def test_ddp_holds_16_bytes_per_parameter_and_4_more_for_its_buckets():
    assert total(1, 8, "ddp-bucket-view") == 16
    assert total(1, 8, "ddp") == 20


def test_fsdp_on_the_whole_model_shards_the_state_but_gathers_full_weights_and_gradients():
    # 16 bytes / N of shards, plus the whole unit's weights and gradients at the peak
    assert total(1, 8, "fsdp-whole") == pytest.approx(16 / 8 + 8)
    assert total(1, 8, "fsdp-blocks", blocks=32) == pytest.approx(16 / 8 + 8 / 32)
    assert total(7e9, 8, "fsdp-blocks", 32) < total(7e9, 8, "fsdp-whole") < total(7e9, 8, "ddp")


def test_unknown_scheme_is_refused():
    with pytest.raises(ValueError, match="unknown scheme"):
        memory.per_rank(1, 2, "zero3")


def test_the_figure_has_a_bar_per_scheme():
    fig = memory.figure(7e9, ranks=8, blocks=32, name="a 7B LM", gpu_gib=80)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == list(memory.LABELS.values())
