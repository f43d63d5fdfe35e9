"""Who held each GPU when: a PNG picture and a Chrome trace (JSON) that Perfetto opens."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from commands.demo.analysis import Hold, idle_wait_spans, on_gpu
from commands.demo.runner import PhaseResult

WIDTH = 1200
LABEL_W = 190
ROW_H = 28
TOP = 34
AXIS_H = 28
PAD = 10
WAIT_COLOUR = "#d62728"
COLOURS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2", "#edc948")


def png_size(rows: int) -> tuple[int, int]:
    """Width and height of the PNG for `rows` GPU rows."""
    return WIDTH, TOP + rows * ROW_H + AXIS_H + PAD


def _names(phase: PhaseResult) -> dict[str, str]:
    return {t.tenant_id: t.name for t in phase.tenants}


def _clipped(phase: PhaseResult, gpu: str) -> list[tuple[Hold, float, float]]:
    """The GPU's holds inside the window, as seconds from its start."""
    out = []
    for h in phase.holds:
        start, end = max(h.start, phase.t0), min(h.end, phase.t1)
        if h.gpu == gpu and end > start:
            out.append((h, start - phase.t0, end - phase.t0))
    return out


def _waits(phase: PhaseResult, gpu: str) -> list[tuple[float, float]]:
    """Spans the GPU sat idle while a tenant waited for it, as seconds from the window's start."""
    spans = idle_wait_spans(on_gpu(phase.holds, gpu), phase.requested(), phase.t0, phase.t1)
    return [(a - phase.t0, b - phase.t0) for a, b in spans if b > a]


def write_png(path: Path, phases: Sequence[PhaseResult], title: str) -> tuple[int, int]:
    """Draw one row per GPU per phase, coloured by holder; returns the image size."""
    rows = [(p, g) for p in phases for g in p.gpus]
    size = png_size(len(rows))
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default()
    wall = max(p.wall_s for p in phases)
    plot_w = WIDTH - LABEL_W - PAD

    def x(seconds: float) -> float:
        return LABEL_W + seconds / wall * plot_w

    draw.text((PAD, 10), title, fill="black", font=font)
    names = sorted({n for p in phases for n in _names(p).values()})
    colour = {n: COLOURS[i % len(COLOURS)] for i, n in enumerate(names)}
    legend = [(n, colour[n]) for n in names] + [("idle, a tenant waiting", WAIT_COLOUR)]
    lx = WIDTH - PAD - sum(30 + 6 * len(n) for n, _ in legend)
    for name, fill in legend:
        draw.rectangle((lx, 10, lx + 12, 22), fill=fill)
        draw.text((lx + 16, 10), name, fill="black", font=font)
        lx += 30 + 6 * len(name)
    for row, (phase, gpu) in enumerate(rows):
        y = TOP + row * ROW_H
        draw.text((PAD, y + 8), f"{phase.label} {gpu}", fill="black", font=font)
        draw.rectangle((LABEL_W, y + 3, WIDTH - PAD, y + ROW_H - 3), fill="#eeeeee")
        names_of = _names(phase)
        for hold, start, end in _clipped(phase, gpu):
            name = names_of.get(hold.tenant_id, hold.tenant_id)
            draw.rectangle((x(start), y + 3, x(end), y + ROW_H - 3), fill=colour.get(name))
        for start, end in _waits(phase, gpu):
            draw.rectangle((x(start), y + ROW_H - 9, x(end), y + ROW_H - 3), fill=WAIT_COLOUR)
    axis_y = TOP + len(rows) * ROW_H + 4
    draw.line((LABEL_W, axis_y, WIDTH - PAD, axis_y), fill="black")
    step = max(1, round(wall / 10))
    for s in range(0, int(wall) + 1, step):
        draw.line((x(s), axis_y, x(s), axis_y + 4), fill="black")
        draw.text((x(s) - 4, axis_y + 7), f"{s}s", fill="black", font=font)
    image.save(path, format="PNG")
    return size


def chrome_trace(phases: Sequence[PhaseResult]) -> dict[str, Any]:
    """Trace events: one process per phase, one thread per GPU, one slice per turn (µs)."""
    events: list[dict[str, Any]] = []
    for pid, phase in enumerate(phases, start=1):
        events.append(
            {"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
             "args": {"name": f"{phase.label} ({len(phase.gpus)} GPU)"}}
        )  # fmt: skip
        names_of = _names(phase)
        for tid, gpu in enumerate(phase.gpus, start=1):
            events.append(
                {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": gpu}}
            )
            for hold, start, end in _clipped(phase, gpu):
                events.append(
                    {
                        "name": names_of.get(hold.tenant_id, hold.tenant_id),
                        "cat": "turn",
                        "ph": "X",
                        "pid": pid,
                        "tid": tid,
                        "ts": round(start * 1e6, 1),
                        "dur": round((end - start) * 1e6, 1),
                        "args": {
                            "tenant_id": hold.tenant_id,
                            "lease_id": hold.lease_id,
                            "fencing_token": hold.token,
                        },
                    }
                )
            for start, end in _waits(phase, gpu):
                events.append(
                    {"name": "idle, a tenant waiting", "cat": "wait", "ph": "X", "pid": pid,
                     "tid": tid, "ts": round(start * 1e6, 1), "dur": round((end - start) * 1e6, 1)}
                )  # fmt: skip
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_timeline(out_dir: Path, phases: Sequence[PhaseResult], title: str) -> tuple[Path, Path]:
    """Write `timeline.png` and `timeline.trace.json` under `out_dir`; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    png = out_dir / "timeline.png"
    trace = out_dir / "timeline.trace.json"
    write_png(png, phases, title)
    trace.write_text(json.dumps(chrome_trace(phases)))
    return png, trace
