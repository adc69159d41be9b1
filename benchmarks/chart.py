"""Draw the benchmark table's JSON as one SVG (no plotting library: the file is written by hand).

Left: latency against the floor: for every time figure that has a floor, its ratio to that floor
on a logarithmic axis, the 1x line, and the issue's goal where it is a ratio (`<= 3x floor`);
rows are named by their key in the JSON. Right: throughput against sessions: cells/s of each
provider at 1, 8 and 64 sessions, and the goal line.

Run: `python -m benchmarks.chart [--json benchmarks/results/latest.json] [--out
docs/benchmarks.svg]` (from the repository's root).
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Sequence
from html import escape
from pathlib import Path

from benchmarks._measure import DEFAULT_JSON, Figure, Table, read_json

DEFAULT_SVG = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.svg"
RATIO_GOAL = re.compile(r"<= ([0-9.]+)x floor")
RATE_GOAL = re.compile(r">= ([0-9,]+) cells/s")
COLORS = {
    "in-process": "#4c78a8",
    "process": "#e45756",
    "thin-host": "#54a24b",
    "other": "#9d9d9d",
}
FONT = 'font-family="sans-serif"'

WIDTH = 1180
BAR_LEFT = 190
BAR_WIDTH = 300
ROW = 18
TOP = 50
PLOT_X = 850
PLOT_W = 300
PLOT_H = 240


def _text(
    x: float, y: float, text: str, anchor: str = "start", extra: str = "", size: int = 11
) -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" {FONT} font-size="{size}"'
        f" {extra}>{escape(text)}</text>"
    )


def _latency(figures: Sequence[Figure]) -> tuple[list[str], float]:
    rows = [f for f in figures if f.ratio is not None and f.unit in {"ms", "us"}]
    if not rows:
        return [_text(10, TOP, "no latency figure with a floor")], TOP + ROW
    ratios = [f.ratio for f in rows if f.ratio is not None]
    goals = [float(m.group(1)) for f in rows if f.goal and (m := RATIO_GOAL.search(f.goal))]
    low = min([*ratios, 1.0]) / 1.5
    high = max([*ratios, *goals, 1.0]) * 1.5
    span = math.log10(high) - math.log10(low)

    def x(ratio: float) -> float:
        return BAR_LEFT + BAR_WIDTH * (math.log10(ratio) - math.log10(low)) / span

    out = [_text(10, TOP - 25, "Latency against its floor (ratio, log scale)", size=13)]
    bottom = TOP + ROW * len(rows)
    for tick in (0.1, 0.3, 1, 3, 10, 30, 100, 300):
        if low <= tick <= high:
            out.append(
                f'<line x1="{x(tick):.1f}" y1="{TOP - 8}" x2="{x(tick):.1f}" y2="{bottom}"'
                f' stroke="{"#333" if tick == 1 else "#ddd"}"/>'
            )
            out.append(_text(x(tick), bottom + 14, f"{tick:g}x", "middle"))
    for i, each in enumerate(rows):
        assert each.ratio is not None
        y = TOP + ROW * i
        color = COLORS.get(each.key.rsplit("/", 1)[-1], COLORS["other"])
        start, end = sorted((x(1.0), x(each.ratio)))
        out.append(_text(BAR_LEFT - 6, y + 4, each.key, "end"))
        out.append(
            f'<rect x="{start:.1f}" y="{y - 6}" width="{max(end - start, 1):.1f}" height="12"'
            f' fill="{color}"/>'
        )
        floor = each.floor.median if each.floor else 0.0
        out.append(
            _text(
                BAR_LEFT + BAR_WIDTH + 6,
                y + 4,
                f"{each.ratio:.2f}x ({each.value.median:.3g} vs {floor:.3g} {each.unit})",
            )
        )
        if each.goal and (match := RATIO_GOAL.search(each.goal)):
            goal = x(float(match.group(1)))
            out.append(
                f'<line x1="{goal:.1f}" y1="{y - 8}" x2="{goal:.1f}" y2="{y + 8}"'
                ' stroke="#000" stroke-width="2"/>'
            )
    out.append(_text(BAR_LEFT, bottom + 30, "| black tick: the issue's goal", extra='fill="#555"'))
    return out, bottom + 40


def _throughput(figures: Sequence[Figure]) -> list[str]:
    rates = [f for f in figures if f.key.startswith("throughput/")]
    out = [_text(PLOT_X - 40, TOP - 25, "Throughput against sessions", size=13)]
    if not rates:
        return [*out, _text(PLOT_X, TOP + 20, "no throughput figure")]
    series: dict[str, list[tuple[int, float]]] = {}
    for each in rates:
        _, sessions, provider = each.key.split("/")
        series.setdefault(provider, []).append((int(sessions), each.value.median))
    goals = [
        float(m.group(1).replace(",", ""))
        for f in rates
        if f.goal and (m := RATE_GOAL.search(f.goal))
    ]
    top = max([v for points in series.values() for _, v in points] + goals) * 1.15
    counts = sorted({s for points in series.values() for s, _ in points})
    lowest, highest = math.log2(counts[0]), math.log2(max(counts[-1], counts[0] * 2))

    def x(sessions: int) -> float:
        return PLOT_X + PLOT_W * (math.log2(sessions) - lowest) / (highest - lowest)

    def y(rate: float) -> float:
        return TOP + PLOT_H * (1 - rate / top)

    out.append(
        f'<rect x="{PLOT_X}" y="{TOP}" width="{PLOT_W}" height="{PLOT_H}" fill="none"'
        ' stroke="#999"/>'
    )
    for fraction in (0, 0.25, 0.5, 0.75, 1):
        rate = top * fraction
        out.append(_text(PLOT_X - 6, y(rate) + 4, f"{rate:,.0f}", "end"))
    for count in counts:
        out.append(_text(x(count), TOP + PLOT_H + 14, str(count), "middle"))
    out.append(_text(PLOT_X + PLOT_W / 2, TOP + PLOT_H + 30, "concurrent sessions", "middle"))
    out.append(_text(PLOT_X - 6, TOP - 8, "cells/s", "end"))
    for goal in goals:
        out.append(
            f'<line x1="{PLOT_X}" y1="{y(goal):.1f}" x2="{PLOT_X + PLOT_W}" y2="{y(goal):.1f}"'
            ' stroke="#000" stroke-dasharray="4 3"/>'
        )
        out.append(_text(PLOT_X + 4, y(goal) - 4, f"goal {goal:,.0f} (64 sessions, process)"))
    for n, (provider, points) in enumerate(sorted(series.items())):
        color = COLORS.get(provider, "#666")
        path = " ".join(f"{x(s):.1f},{y(v):.1f}" for s, v in sorted(points))
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for s, v in points:
            out.append(f'<circle cx="{x(s):.1f}" cy="{y(v):.1f}" r="3" fill="{color}"/>')
        legend = PLOT_X + 90 * n
        out.append(_text(legend, TOP + PLOT_H + 48, f"— {provider}", extra=f'fill="{color}"'))
    return out


def svg(table: Table) -> str:
    """The chart of `table` as an SVG document."""
    latency, height = _latency(table.figures)
    height = max(height, TOP + PLOT_H + 60) + 20
    machine = table.machine
    caption = (
        f"{table.started}, {table.mode} run; {machine.cpus} CPUs ({machine.cpu_model}),"
        f" Python {machine.python}; load average {machine.load_average[0]:.2f} at the start"
    )
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0f}"'
        f' viewBox="0 0 {WIDTH} {height:.0f}">',
        '<rect width="100%" height="100%" fill="#fff"/>',
        *latency,
        *_throughput(table.figures),
        _text(10, height - 8, caption, extra='fill="#555"'),
        "</svg>",
    ]
    return "\n".join(parts) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="the table's JSON")
    parser.add_argument("--out", type=Path, default=DEFAULT_SVG, help="where to write the SVG")
    arguments = parser.parse_args(argv)
    arguments.out.write_text(svg(read_json(arguments.json)))
    print(f"written: {arguments.out}")


if __name__ == "__main__":
    main()
