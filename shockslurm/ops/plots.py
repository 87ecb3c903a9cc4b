"""Charts of a run as PNG files, drawn from plain data (lists of tuples), never from ORM rows.

Why plain data: the same charts must come out of `shockslurm simulate --plot` (a `SimResult` in
memory) and `shockslurm report` (a run read back from the store, simulated or live); the two
adapters in `ops.runs` build these tuples and everything below is shared.

matplotlib is imported lazily with the non-interactive Agg backend, so importing this module is
cheap and never needs a display (daemons, CI, ssh sessions).

Each chart is written atomically (`shockslurm.atomic`: drawn into a temporary file in the
directory, then renamed onto its name), so a failed write (disk full, a directory already at a
chart's name) leaves the file already there untouched and is an `OutputWriteError` naming the
file and the option that named the directory (`--plot DIR`, `--out DIR`), never a traceback.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from ..atomic import OutputWriteError, describe, write_file

# (job label, start s, width s, gang size): one bar of the GPU allocation timeline.
TimelineBar = tuple[str, float, float, int]
# (round start s, GPUs used, GPUs in the cluster): one step of the utilisation curve.
UtilStep = tuple[float, int, int]

DPI = 110


@dataclass
class RunSeries:
    """Everything the charts need of one run: what the adapters produce."""

    label: str                        # e.g. "run 3 max_min_fairness" (titles, file names)
    policy: str
    timeline: list[TimelineBar] = field(default_factory=list)
    utilisation: list[UtilStep] = field(default_factory=list)
    rho: list[float] = field(default_factory=list)   # one value per finished job
    rho_definition: str = "JCT / (exclusive runtime * max(1, N / G))"


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _time_axis(seconds: Sequence[float]) -> tuple[float, str]:
    """A divisor and unit that keep tick labels short (s, min or h)."""
    span = (max(seconds) - min(seconds)) if seconds else 0.0
    if span > 4 * 3600:
        return 3600.0, "h"
    if span > 600:
        return 60.0, "min"
    return 1.0, "s"


def plot_timeline(bars: Sequence[TimelineBar], out: Path, *, title: str,
                  within: Path | None = None) -> Path:
    """Gantt-like chart: one row per job, one bar per round it held GPUs, coloured by gang size.

    Times are shown relative to the first bar (live runs store Unix seconds).
    """
    plt = _pyplot()
    from matplotlib.patches import Patch

    jobs = sorted({b[0] for b in bars}, key=_natural)
    row = {job: i for i, job in enumerate(jobs)}
    origin = min((b[1] for b in bars), default=0.0)
    scale, unit = _time_axis([b[1] for b in bars] + [b[1] + b[2] for b in bars])
    gangs = sorted({b[3] for b in bars})
    cmap = plt.get_cmap("viridis", max(2, len(gangs)))
    colour = {g: cmap(i) for i, g in enumerate(gangs)}
    height = min(12.0, max(3.0, 0.18 * len(jobs) + 1.5))
    fig, ax = plt.subplots(figsize=(10, height))
    try:
        by_gang: dict[int, list[tuple[int, float, float]]] = {}
        for job, start, width, gang in bars:
            by_gang.setdefault(gang, []).append((row[job], (start - origin) / scale, width / scale))
        for gang, items in by_gang.items():
            for r, x, w in items:
                ax.broken_barh([(x, w)], (r - 0.4, 0.8), facecolors=colour[gang],
                               edgecolor="none")
        ax.set_yticks(range(len(jobs)))
        ax.set_yticklabels(jobs, fontsize=max(4, min(9, int(300 / max(1, len(jobs))))))
        ax.set_ylim(-1, max(1, len(jobs)))
        ax.invert_yaxis()
        ax.set_xlabel(f"time since first allocation ({unit})")
        ax.set_ylabel("job")
        ax.set_title(title)
        ax.legend(handles=[Patch(color=colour[g], label=f"{g} GPU{'s' if g > 1 else ''}")
                           for g in gangs], title="gang size", loc="upper right", fontsize=8)
        if not bars:
            ax.text(0.5, 0.5, "no allocations recorded", transform=ax.transAxes, ha="center")
        fig.tight_layout()
        _save(fig, out, within)
    finally:
        plt.close(fig)
    return out


def plot_utilisation(steps: Sequence[UtilStep], out: Path, *, title: str,
                     within: Path | None = None) -> Path:
    """GPUs used / GPUs in the cluster per round, as a step curve (0..1)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 3.5))
    try:
        if steps:
            origin = steps[0][0]
            scale, unit = _time_axis([s[0] for s in steps])
            xs = [(t - origin) / scale for t, _, _ in steps]
            ys = [used / total if total > 0 else 0.0 for _, used, total in steps]
            ax.step(xs, ys, where="post", color="tab:blue", linewidth=1.2)
            ax.fill_between(xs, ys, step="post", alpha=0.3, color="tab:blue")
            spans = [b - a for a, b in zip(xs, xs[1:])]   # the last round's length is unknown
            mean = (sum(y * w for y, w in zip(ys, spans)) / sum(spans) if sum(spans) > 0
                    else sum(ys) / len(ys))
            ax.axhline(mean, color="tab:red", linestyle="--", linewidth=1,
                       label=f"time-weighted mean {mean:.2f}")
            ax.legend(loc="lower right", fontsize=8)
            ax.set_xlabel(f"time since first round ({unit})")
        else:
            ax.text(0.5, 0.5, "no rounds recorded", transform=ax.transAxes, ha="center")
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("GPUs used / total")
        ax.set_title(title)
        fig.tight_layout()
        _save(fig, out, within)
    finally:
        plt.close(fig)
    return out


def plot_rho(rho_by_label: Mapping[str, Sequence[float]], out: Path, *,
             title: str = "finish-time fairness rho per policy",
             definition: str = RunSeries.rho_definition, within: Path | None = None) -> Path:
    """Box plot of rho per policy/run with every job as a jittered point; rho = 1 marked."""
    plt = _pyplot()
    import numpy as np

    labels = [k for k, v in rho_by_label.items() if len(v)]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(labels) + 2), 4.5))
    try:
        if labels:
            data = [np.asarray(rho_by_label[k], dtype=float) for k in labels]
            ax.boxplot(data, showfliers=False)
            ax.set_xticks(range(1, len(labels) + 1))
            ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=8)
            rng = np.random.default_rng(0)   # fixed jitter: the same data gives the same image
            cmap = plt.get_cmap("tab10")
            for i, values in enumerate(data, start=1):
                ax.scatter(i + rng.uniform(-0.18, 0.18, len(values)), values, s=10,
                           alpha=0.7, color=cmap((i - 1) % 10), zorder=3)
            ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
            flat = np.concatenate(data)
            if flat.min() > 0 and flat.max() / flat.min() > 50:   # a few outliers hide the rest
                ax.set_yscale("log")
        else:
            ax.text(0.5, 0.5, "no finished jobs with known exclusive runtime",
                    transform=ax.transAxes, ha="center")
        ax.set_ylabel("rho")
        ax.set_title(f"{title}\nrho = {definition}", fontsize=10)
        fig.tight_layout()
        _save(fig, out, within)
    finally:
        plt.close(fig)
    return out


def _save(fig: Any, out: Path, within: Path | None) -> None:
    """`fig` as a PNG at `out`, atomically; `within`: the directory an option named (for the
    error message)."""
    write_file(out, lambda fh: fig.savefig(fh, format="png", dpi=DPI), within=within)


def _natural(label: str) -> tuple:
    """Sort "job 10" after "job 9"."""
    digits = "".join(c for c in label if c.isdigit())
    return (int(digits) if digits else -1, label)


def safe_name(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text).strip("-")


def write_run_plots(series: Sequence[RunSeries], out_dir: Path) -> Iterator[Path]:
    """Per run: `<label>-timeline.png` and `<label>-utilisation.png`; for all runs together:
    `rho-by-policy.png` (only when some run has rho values). Yields each file once written, so
    a caller that lists them has listed every chart written before a write that fails
    (until 2026-12-03 the list was returned at the end, and lost with the error)."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:   # a race with the command line's check, or a file in the way
        raise OutputWriteError(f"{describe(out_dir)}: cannot create the directory: "
                               f"{exc.strerror or exc}") from None
    for s in series:
        stem = safe_name(s.label)
        yield plot_timeline(s.timeline, out_dir / f"{stem}-timeline.png",
                            title=f"GPU allocation per job: {s.label}", within=out_dir)
        yield plot_utilisation(s.utilisation, out_dir / f"{stem}-utilisation.png",
                               title=f"GPU utilisation per round: {s.label}", within=out_dir)
    rho = {s.label: s.rho for s in series if s.rho}
    if rho:
        yield plot_rho(rho, out_dir / "rho-by-policy.png",
                       definition=next(s.rho_definition for s in series if s.rho),
                       within=out_dir)
