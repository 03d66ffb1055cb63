"""The answer at a glance: one SVG of a ledger's results, drawn by hand so that it is the same bytes on every machine.

Top: pass@1 of every method (a row) in every column (a panel), a dot with its 95% interval over tasks; a hollow dot
is a framework the row trained in (not a transfer figure). Bottom: the transfer curve, harness-scaling against
single along RL, on the harnesses each trained on (solid) and on the held-out In-Space set (dashed): the mean over
seeds, with a band from the lowest to the highest seed.

experiments/compare.py --ledger calls `svg` with the numbers of its tables; nothing here computes a statistic.
"""
from html import escape

LABEL_W = 215  # the row names' width, px
PANEL_W, PANEL_GAP = 116, 26  # one column's panel
ROW_H = 18
CURVE_W, CURVE_H = 420, 200
COLORS = {"harness-scaling": "#1f6fb4", "single": "#c8372d"}


def text(x, y, s, size=11, anchor="start", weight="normal", fill="#222"):
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" font-weight="{weight}" '
            f'fill="{fill}">{escape(s)}</text>')


def line(x1, y1, x2, y2, stroke="#222", width=1.0, dash=None):
    extra = f' stroke-dasharray="{dash}"' if dash else ""
    return (f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{stroke}" '
            f'stroke-width="{width}"{extra}/>')


def polyline(points, stroke, dash=None, width=1.8):
    extra = f' stroke-dasharray="{dash}"' if dash else ""
    pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    return f'<polyline points="{pts}" fill="none" stroke="{stroke}" stroke-width="{width}"{extra}/>'


def band(upper, lower, fill):
    pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in upper + lower[::-1])
    return f'<polygon points="{pts}" fill="{fill}" fill-opacity="0.15" stroke="none"/>'


def dot(x, y, hollow=False):
    fill = "white" if hollow else "#222"
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{fill}" stroke="#222" stroke-width="1.2"/>'


def seeds(n):
    return f"{n} seed" + ("s" if n > 1 else "")


def svg(title, columns, rows, curve=None):
    """columns: [(key, title)]; rows: [(name, {key: (pass1, lo, hi, trained_in) or None})], all in %;
    curve: {method: {"trained": [(iteration, mean, lowest, highest)], "held-out": [...]}, "seeds": {method: n}}
    in %, or None. -> the SVG document (str)."""
    top = 62  # the panels' first row
    panels_h = top + ROW_H * len(rows) + 34
    width = LABEL_W + len(columns) * (PANEL_W + PANEL_GAP)
    height = panels_h + (CURVE_H + 90 if curve else 0)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           text(8, 18, title, size=13, weight="bold")]
    bottom = top + ROW_H * len(rows) - ROW_H / 2 + 4
    for i, (name, _) in enumerate(rows):
        y = top + ROW_H * i
        out.append(text(LABEL_W - 8, y + 4, name, anchor="end",
                        weight="bold" if name.startswith("harness-scaling") else "normal"))
    for j, (key, col_title) in enumerate(columns):
        x0 = LABEL_W + j * (PANEL_W + PANEL_GAP)

        def x_of(pct, x0=x0):  # 0-100% across the panel
            return x0 + PANEL_W * pct / 100

        name, _, under = col_title.partition(" (")  # "In-Space (120 tasks)": the name above its task count
        out += [text(x0 + PANEL_W / 2, top - 30, name, size=10.5, anchor="middle", weight="bold"),
                text(x0 + PANEL_W / 2, top - 17, "(" + under if under else "", size=9.5, anchor="middle")]
        for tick in (0, 25, 50, 75, 100):
            out.append(line(x_of(tick), top - 10, x_of(tick), bottom, stroke="#ddd" if tick % 50 else "#bbb"))
            if tick % 50 == 0:
                out.append(text(x_of(tick), bottom + 13, str(tick), size=9, anchor="middle", fill="#666"))
        for i, (_, cells) in enumerate(rows):
            cell = cells.get(key)
            if cell is None:
                continue
            p, lo, hi, trained_in = cell
            y = top + ROW_H * i
            out += [line(x_of(lo), y, x_of(hi), y, width=1.4), dot(x_of(p), y, hollow=trained_in)]
    out.append(text(LABEL_W, bottom + 27, "pass@1 (%), greedy, with its 95% interval over test tasks; hollow: the "
                                          "row trained inside that framework", size=9.5, fill="#444"))
    if curve:
        out += curve_panel(curve, panels_h + 30)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def curve_panel(curve, y0):
    """The transfer curve below the panels: x = RL iterations, y = pass@1 (%)."""
    x0 = LABEL_W
    lines = curve["lines"]
    last = max(p[0] for m in lines.values() for pts in m.values() for p in pts) or 1
    high = max(p[3] for m in lines.values() for pts in m.values() for p in pts)
    y_max = max(10, 10 * -(-high // 10))  # the highest seed, up to the next 10%

    def xy(it, pct):
        return x0 + CURVE_W * it / last, y0 + CURVE_H * (1 - pct / y_max)

    title = f"the transfer curve: pass@1 (%) along RL on the first {curve['tasks']} test tasks"
    out = [text(x0 - 8, y0 - 14, title, size=11, weight="bold")]
    for tick in range(0, int(y_max) + 1, 10):
        _, y = xy(0, tick)
        out += [line(x0, y, x0 + CURVE_W, y, stroke="#e4e4e4"), text(x0 - 6, y + 3, str(tick), size=9,
                                                                       anchor="end", fill="#666")]
    its = sorted({p[0] for m in lines.values() for pts in m.values() for p in pts})
    for it in its:
        x, y = xy(it, 0)
        out.append(text(x, y + 13, str(it), size=9, anchor="middle", fill="#666"))
    out.append(text(x0 + CURVE_W / 2, y0 + CURVE_H + 28, "RL iterations", size=10, anchor="middle", fill="#444"))
    legend_y = y0 + 8
    for method, parts in lines.items():
        color = COLORS.get(method.removesuffix("+ppo"), "#555")
        for part, dash in (("trained", None), ("held-out", "6 4")):
            pts = parts.get(part) or []
            if not pts:
                continue
            if any(p[2] != p[3] for p in pts):
                out.append(band([xy(p[0], p[3]) for p in pts], [xy(p[0], p[2]) for p in pts], color))
            out.append(polyline([xy(p[0], p[1]) for p in pts], color, dash=dash))
            lx = x0 + CURVE_W + 24
            out += [line(lx, legend_y, lx + 28, legend_y, stroke=color, width=1.8, dash=dash),
                    text(lx + 34, legend_y + 4, f"{method}, {part} harnesses ({seeds(curve['seeds'][method])})",
                         size=10)]
            legend_y += 18
    out.append(text(x0 + CURVE_W + 24, legend_y + 6, "line: mean over seeds; band: lowest to highest seed",
                    size=9.5, fill="#444"))
    return out
