"""Figures of the scaling model, and sliders that move its efficiency curve (:class:`Explorer`, testable headless)."""

from __future__ import annotations

from collections.abc import Sequence

from workshop_lib.figures import plots
from workshop_lib.scaling import cost, published

GB = 1e9


def measured_vs_model(fit, benchmark: dict[int, float] | None = None, label: str = "benchmark runs"):
    """Speed-up of ``fit.nprocs`` ranks over 1 against the global batch: the model, the lockstep steps timed while
    fitting, and ``benchmark`` ({global batch: measured speed-up} of whole training runs)."""
    n = fit.nprocs
    lo, hi = n * min(fit.together.batches), n * max(fit.together.batches)
    gs = [lo * (hi / lo) ** (i / 40) for i in range(41)]
    model = [fit.alone(g) / fit.predict_step(g).seconds for g in gs]
    fig, (ax,) = plots._new_figure(width=6.4, height=3.8)
    ax.plot(gs, model, "-", color="tab:blue", label="model: inputs measured here")
    live = sorted((n * b, fit.alone(n * b) / fit.measured_step(b)) for b in fit.together.batches)
    ax.plot(*zip(*live, strict=True), "o", color="tab:red", ms=7, label="your lockstep steps (timed above)")
    if benchmark:
        ax.plot(*zip(*sorted(benchmark.items()), strict=True), "s", color="tab:green", ms=7, label=label)
    ax.axhline(n, color="k", ls=":", alpha=0.4, label="perfect")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="global batch", ylabel=f"speed-up, {n} ranks over 1", ylim=(0, n + 0.3))
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def projections(curves: dict[str, list[dict]], title: str = "Projected efficiency"):
    """Efficiency against N for several (model, link) curves, each a ``cost.project`` result."""
    fig, (ax,) = plots._new_figure(width=7.2, height=4.2)
    for label, rows in curves.items():
        ax.plot([r["n"] for r in rows], [r["efficiency"] for r in rows], "o-", ms=3, label=label)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="ranks (GPUs)", ylabel="efficiency (speed-up / N)", ylim=(0, 1.05), title=title)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


class Explorer:
    """An efficiency curve against N that sliders move: model size (compute in proportion), batch, bandwidth, overlap."""

    def __init__(self, work: cost.Workload = published.WORKLOADS["ResNet-50"], alpha: float = 10e-6,
                 ns: Sequence[int] = tuple(cost.ranks(1024))):
        self.work, self.alpha, self.ns = work, alpha, list(ns)
        self.fig, (self.ax,) = plots._new_figure(width=6.4, height=3.8)
        start = self.curve(work.params / 1e6, work.batch, 50.0, 0.0)
        self.ax.plot(self.ns, start, ":", color="gray", label=f"{work.name}, batch {work.batch}, 50 GB/s, no overlap")
        (self.line,) = self.ax.plot(self.ns, start, "o-", ms=3, color="tab:blue", label="your settings")
        self.ax.set_xscale("log", base=2)
        self.ax.set(xlabel="ranks (GPUs)", ylabel="efficiency (speed-up / N)", ylim=(0, 1.05))
        self.ax.legend(fontsize=8, loc="lower left")
        self.ax.grid(alpha=0.3)
        self.fig.tight_layout()
        self.output = None

    def curve(self, params_m: float, batch: int, bandwidth_gbs: float, overlap: float) -> list[float]:
        work = self.work.scaled(params_m * 1e6)
        link = cost.Link("slider", self.alpha, bandwidth_gbs * GB, max(self.ns), algorithm="double-tree")
        return [r["efficiency"] for r in cost.project(work, link, self.ns, batch=batch, overlap=overlap)]

    def update(self, params_m: float, batch: int, bandwidth_gbs: float, overlap: float) -> dict[int, float]:
        """The sliders' callback: recompute the curve, set the line's data, return {N: efficiency}."""
        eff = self.curve(params_m, batch, bandwidth_gbs, overlap)
        self.line.set_ydata(eff)
        self.ax.set_title(f"{params_m:g}M parameters, batch {batch} per rank, {bandwidth_gbs:g} GB/s, "
                          f"overlap {overlap:.0%}", fontsize=9)
        if self.output is not None:
            from IPython.display import display

            with self.output:
                self.output.clear_output(wait=True)
                display(self.fig)
        return dict(zip(self.ns, eff, strict=True))

    def widgets(self):
        """Sliders wired to ``update``, above the figure (an ipywidgets box for a notebook cell)."""
        import ipywidgets as w

        style = {"description_width": "170px"}
        layout = w.Layout(width="520px")
        self.sliders = {
            "params_m": w.FloatLogSlider(value=self.work.params / 1e6, base=10, min=-2, max=3.3, step=0.05,
                                         description="model size (M params)", style=style, layout=layout),
            "batch": w.IntSlider(value=self.work.batch, min=8, max=1024, step=8, description="batch per rank",
                                 style=style, layout=layout),
            "bandwidth_gbs": w.FloatLogSlider(value=50, base=10, min=-1, max=3, step=0.05,
                                              description="bandwidth (GB/s)", style=style, layout=layout),
            "overlap": w.FloatSlider(value=0.0, min=0, max=1, step=0.05, description="overlap with backward",
                                     style=style, layout=layout),
        }
        self.output = w.Output()

        def changed(_=None):
            self.update(**{k: s.value for k, s in self.sliders.items()})

        for s in self.sliders.values():
            s.observe(changed, names="value")
        changed()
        return w.VBox([*self.sliders.values(), self.output])


# ---------------------------------------------------------------- predictions, and the read-off

# question: (what the learner predicts, how close counts, why the model gives what it gives)
PREDICTIONS = {
    "accumulation": ("the efficiency with 5 micro-batches per all-reduce, as a share or a percent (0.5 or 50)", 0.03,
                     "k micro-batches of compute share one all-reduce: efficiency = k x compute / "
                     "(k x compute + all-reduce)"),
    "overlap": ("the all-reduce time left exposed with full overlap, in ms", 0.1,
                "backward (about 2/3 of the compute) hides the all-reduce only up to its own length: "
                "exposed = all-reduce - backward, or 0"),
}


def doubling_stops_paying(rows: list[dict], gain: float = 1.1) -> int | None:
    """The first N from which doubling to 2N adds less than ``gain`` x the samples/s (None: it always pays)."""
    by_n = {r["n"]: r["samples_per_second"] for r in rows}
    return next((n for n in sorted(by_n) if 2 * n in by_n and by_n[2 * n] / by_n[n] < gain), None)


def check(question: str, predicted, expected: float) -> None:
    """Compare a prediction with the model's value: a tick and why, or CheckFailed with the why."""
    from workshop_lib.engine.common import CheckFailed, as_share, is_number, verdict

    what, tolerance, why = PREDICTIONS[question]
    if not is_number(predicted):
        raise CheckFailed(f"your prediction is {predicted!r}: write {what} as a number first")
    share = question == "accumulation"
    if share:
        predicted = as_share(predicted)  # 65 or 1.35: the percent meant, 65% or 1.35%
    close = (abs(predicted - expected) <= tolerance if share
             else abs(predicted - expected) <= max(1.0, tolerance * expected))
    shown = (lambda x: f"{x:.0%}") if share else (lambda x: f"{x:.0f} ms")
    said = f"{100 * predicted:.3g}%" if share else shown(predicted)
    verdict(None if close else f"you predicted {said}, the model gives {shown(expected)}: {why}",
            f"{shown(expected)} (you said {said}): {why}")
