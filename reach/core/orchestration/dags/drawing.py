"""A DAG run drawn for the dashboard: a layered layout and its SVG, computed server-side.

Pure and deterministic (the same graph and states give the same bytes):

- `layers`: longest-path layering, a node one layer right of its deepest dependency
  (roots and isolated nodes in layer 0, the same levels as `reach.core.orchestration.dags.plan`);
- `order_layers`: the order inside each layer, a few barycentre sweeps that reduce edge
  crossings a little, ties kept in declaration order;
- `layout` places the boxes left to right, and `render_svg` draws them: each box coloured
  by its node's state (`STATE_STYLES`), its name escaped, each dependency an arrow, and a
  box whose node has a task linking to that task's page.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import quote

from reach.core.orchestration.dags.model import DagSpec
from reach.errors import DagError

__all__ = [
    "STATE_STYLES",
    "GraphNode",
    "Layout",
    "StateStyle",
    "crossings",
    "graph_of",
    "layers",
    "layout",
    "order_layers",
    "render_svg",
]

BOX_W: Final = 168
BOX_H: Final = 44
GAP_X: Final = 64
GAP_Y: Final = 20
MARGIN: Final = 12
MAX_LABEL: Final = 19
SWEEPS: Final = 4
TASK_HREF: Final = "/ui/tasks/{task_id}"


@dataclass(frozen=True, slots=True)
class StateStyle:
    """How a box of one state looks: fill, stroke, and a dash pattern (None: solid)."""

    fill: str
    stroke: str
    dash: str | None = None


STATE_STYLES: Final[Mapping[str, StateStyle]] = {
    "pending": StateStyle("#f3f4f6", "#9ca3af"),
    "running": StateStyle("#dbeafe", "#2563eb"),
    "awaiting_approval": StateStyle("#fef3c7", "#d97706"),
    "success": StateStyle("#dcfce7", "#16a34a"),
    "failed": StateStyle("#fee2e2", "#dc2626"),
    "timeout": StateStyle("#ffedd5", "#ea580c"),
    "skipped": StateStyle("#f9fafb", "#9ca3af", "4 3"),
}
"""A node row's states (``pending``, ``running``, then a `NodeStatus`), plus
``awaiting_approval`` for a running node whose task is parked for a human."""

UNKNOWN_STYLE: Final = StateStyle("#ffffff", "#6b7280")


@dataclass(frozen=True, slots=True)
class GraphNode:
    """One box: the node, what it depends on, its state, its task (if submitted) and a
    line of detail for its tooltip (the reason it is in that state)."""

    id: str
    dependencies: tuple[str, ...] = ()
    state: str = "pending"
    task_id: str | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Layout:
    """Where every box is (its top-left corner by node id), the drawing's size, and the
    slots long edges pass through."""

    layers: tuple[tuple[str, ...], ...]
    boxes: Mapping[str, tuple[int, int]]
    width: int
    height: int
    waypoints: Mapping[tuple[str, str], tuple[tuple[int, int], ...]] = field(default_factory=dict)
    """A long edge's slots (top-left corners) in the columns it crosses, by (from, to)."""


def graph_of(
    spec: DagSpec,
    states: Mapping[str, str],
    tasks: Mapping[str, str | None] | None = None,
    details: Mapping[str, str] | None = None,
) -> list[GraphNode]:
    """The boxes of a stored run: its spec's nodes and dependencies, with each node's
    state (``pending`` when unknown), task id and detail."""
    tasks = tasks or {}
    details = details or {}
    return [
        GraphNode(
            id=node.id,
            dependencies=tuple(node.dependencies),
            state=states.get(node.id, "pending"),
            task_id=tasks.get(node.id),
            detail=details.get(node.id, ""),
        )
        for node in spec.nodes
    ]


def layers(nodes: Sequence[GraphNode]) -> tuple[tuple[str, ...], ...]:
    """Longest-path layering: a node's layer is 1 + its deepest dependency's (0 without
    any); within a layer, declaration order. A dependency on a node not drawn is ignored;
    a cycle is a `DagError` naming its nodes."""
    known = {n.id for n in nodes}
    deps = {n.id: tuple(dict.fromkeys(d for d in n.dependencies if d in known)) for n in nodes}
    depth: dict[str, int] = {}
    remaining = [n.id for n in nodes]
    while remaining:
        ready = [i for i in remaining if all(d in depth for d in deps[i])]
        if not ready:
            raise DagError(f"dependency cycle among: {', '.join(remaining)}", node=remaining[0])
        for node_id in ready:
            depth[node_id] = 1 + max((depth[d] for d in deps[node_id]), default=-1)
        remaining = [i for i in remaining if i not in depth]
    count = max(depth.values(), default=-1) + 1
    return tuple(tuple(n.id for n in nodes if depth[n.id] == level) for level in range(count))


def _edges(nodes: Sequence[GraphNode]) -> list[tuple[str, str]]:
    known = {n.id for n in nodes}
    return [(dep, n.id) for n in nodes for dep in dict.fromkeys(n.dependencies) if dep in known]


def crossings(order: Sequence[Sequence[str]], edges: Sequence[tuple[str, str]]) -> int:
    """Pairs of edges that cross, with boxes at ``order``'s positions (an edge spanning
    several layers counts as the straight line between its ends' rows, layer by layer)."""
    where = {node: (layer, row) for layer, ids in enumerate(order) for row, node in enumerate(ids)}
    gaps: dict[int, list[tuple[float, float]]] = {}  # by left layer: (row at left, at right)
    for src, dst in edges:
        (l1, r1), (l2, r2) = where[src], where[dst]
        span = l2 - l1
        for step in range(span):
            a = r1 + (r2 - r1) * step / span
            b = r1 + (r2 - r1) * (step + 1) / span
            gaps.setdefault(l1 + step, []).append((a, b))
    total = 0
    for segments in gaps.values():
        for i, (a1, a2) in enumerate(segments):
            total += sum(1 for b1, b2 in segments[i + 1 :] if (a1 - b1) * (a2 - b2) < 0)
    return total


def order_layers(nodes: Sequence[GraphNode], sweeps: int = SWEEPS) -> tuple[tuple[str, ...], ...]:
    """`layers`, each reordered to reduce crossings a little (see `_ordered`)."""
    order, _ = _ordered(nodes, sweeps)
    return tuple(tuple(n for n in layer if not n.startswith(_WAYPOINT)) for layer in order)


_WAYPOINT: Final = "\x00"  # starts the id of a waypoint (no node id does)


def _expanded(
    nodes: Sequence[GraphNode],
) -> tuple[list[list[str]], list[tuple[str, str]], dict[tuple[str, str], list[str]]]:
    """The layers with a waypoint in every layer a long edge crosses (so an edge is never
    drawn through a box), the edges between adjacent layers, and each edge's waypoints."""
    base = layers(nodes)
    level = {node: i for i, layer in enumerate(base) for node in layer}
    expanded = [list(layer) for layer in base]
    edges: list[tuple[str, str]] = []
    chains: dict[tuple[str, str], list[str]] = {}
    for src, dst in _edges(nodes):
        previous, chain = src, []
        for step in range(1, level[dst] - level[src]):
            point = f"{_WAYPOINT}{src}{_WAYPOINT}{dst}{_WAYPOINT}{step}"
            expanded[level[src] + step].append(point)
            chain.append(point)
            edges.append((previous, point))
            previous = point
        edges.append((previous, dst))
        chains[(src, dst)] = chain
    return expanded, edges, chains


def _ordered(
    nodes: Sequence[GraphNode], sweeps: int = SWEEPS
) -> tuple[tuple[tuple[str, ...], ...], dict[tuple[str, str], list[str]]]:
    """The layers (waypoints included) ordered to reduce crossings a little: alternate
    sweeps sort a layer by the mean row of its neighbours in the layer just placed (down:
    its dependencies; up: its dependants); the ordering with the fewest crossings wins,
    the declaration order on a tie. Also each long edge's waypoints."""
    expanded, edges, chains = _expanded(nodes)
    preds: dict[str, list[str]] = {n: [] for layer in expanded for n in layer}
    succs: dict[str, list[str]] = {n: [] for layer in expanded for n in layer}
    for src, dst in edges:
        preds[dst].append(src)
        succs[src].append(dst)
    start = tuple(tuple(layer) for layer in expanded)
    current = [list(layer) for layer in expanded]
    best, best_count = start, crossings(start, edges)
    for sweep in range(sweeps):
        down = sweep % 2 == 0
        indexes = range(1, len(current)) if down else range(len(current) - 2, -1, -1)
        for index in indexes:
            current[index] = _by_barycentre(current, index, preds if down else succs)
        candidate = tuple(tuple(layer) for layer in current)
        count = crossings(candidate, edges)
        if count < best_count:
            best, best_count = candidate, count
    return best, chains


def _by_barycentre(
    current: list[list[str]], index: int, neighbours: Mapping[str, list[str]]
) -> list[str]:
    """Layer ``index`` sorted by the mean row of each node's ``neighbours`` (a node with
    none keeps its row; ties keep the current order)."""
    row = {node: r for layer in current for r, node in enumerate(layer)}

    def key(pos: int, node: str) -> tuple[float, int]:
        linked = neighbours[node]
        return (sum(row[o] for o in linked) / len(linked) if linked else float(pos), pos)

    return [node for _, node in sorted(enumerate(current[index]), key=lambda p: key(*p))]


def layout(nodes: Sequence[GraphNode]) -> Layout:
    """Boxes left to right, one column per layer, each column centred vertically; a long
    edge gets a slot of its own in each column it crosses (its waypoints)."""
    order, chains = _ordered(nodes)
    tallest = max((len(layer) for layer in order), default=0)
    height = 2 * MARGIN + tallest * BOX_H + max(tallest - 1, 0) * GAP_Y
    width = 2 * MARGIN + len(order) * BOX_W + max(len(order) - 1, 0) * GAP_X
    slots: dict[str, tuple[int, int]] = {}
    for column, ids in enumerate(order):
        used = len(ids) * BOX_H + (len(ids) - 1) * GAP_Y
        top = MARGIN + (height - 2 * MARGIN - used) // 2
        for row, node_id in enumerate(ids):
            slots[node_id] = (MARGIN + column * (BOX_W + GAP_X), top + row * (BOX_H + GAP_Y))
    boxes = {n: xy for n, xy in slots.items() if not n.startswith(_WAYPOINT)}
    waypoints = {edge: tuple(slots[p] for p in chain) for edge, chain in chains.items()}
    real = tuple(tuple(n for n in layer if not n.startswith(_WAYPOINT)) for layer in order)
    return Layout(real, boxes, width, height, waypoints)


def _edge_path(
    start: tuple[int, int], through: Sequence[tuple[int, int]], end: tuple[int, int]
) -> str:
    """From a box's right side to the next box's left side, across each waypoint's slot
    (a straight run at mid-height), as cubic curves between columns."""
    points = [start]
    for x, y in through:
        points += [(x, y + BOX_H // 2), (x + BOX_W, y + BOX_H // 2)]
    points.append(end)
    d = [f"M {start[0]} {start[1]}"]
    for i in range(1, len(points)):
        (x1, y1), (x2, y2) = points[i - 1], points[i]
        if i % 2:  # a gap between columns
            bend = (x2 - x1) // 2
            d.append(f"C {x1 + bend} {y1}, {x2 - bend} {y2}, {x2} {y2}")
        else:  # across a waypoint's column
            d.append(f"L {x2} {y2}")
    return " ".join(d)


def _label(text: str) -> str:
    return text if len(text) <= MAX_LABEL else text[: MAX_LABEL - 1] + "\u2026"


def render_svg(
    nodes: Sequence[GraphNode], *, task_href: str = TASK_HREF, title: str = "DAG run"
) -> str:
    """The drawing as one ``<svg>`` element (text to embed in a page as is: every name
    and detail in it is escaped). ``task_href`` is the link of a box whose node has a
    task, with ``{task_id}`` replaced by the (URL-quoted) task id."""
    placed = layout(nodes)
    esc = html.escape
    by_id = {n.id: n for n in nodes}
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="dag-graph" role="img" '
        f'aria-label="{esc(title)}" width="{placed.width}" height="{placed.height}" '
        f'viewBox="0 0 {placed.width} {placed.height}" font-family="system-ui, sans-serif">',
        "<defs>"
        '<marker id="dag-arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" '
        'markerHeight="8" orient="auto-start-reverse">'
        '<path d="M 0 0 L 10 5 L 0 10 z" fill="#6b7280"/></marker>'
        "</defs>",
        '<g class="dag-edges" fill="none" stroke="#6b7280" stroke-width="1.5">',
    ]
    for src, dst in _edges(nodes):
        (x1, y1), (x2, y2) = placed.boxes[src], placed.boxes[dst]
        d = _edge_path(
            (x1 + BOX_W, y1 + BOX_H // 2),
            placed.waypoints.get((src, dst), ()),
            (x2, y2 + BOX_H // 2),
        )
        out.append(
            f'<path class="dag-edge" data-from="{esc(src)}" data-to="{esc(dst)}" d="{d}" '
            'marker-end="url(#dag-arrow)"/>'
        )
    out.append("</g>")
    out.append('<g class="dag-nodes">')
    for node_id in (n for layer in placed.layers for n in layer):
        node = by_id[node_id]
        x, y = placed.boxes[node_id]
        style = STATE_STYLES.get(node.state, UNKNOWN_STYLE)
        dash = f' stroke-dasharray="{style.dash}"' if style.dash else ""
        tip = f"{node.id}: {node.state}" + (f" \u2014 {node.detail}" if node.detail else "")
        box = (
            f'<g class="dag-node state-{esc(node.state)}" data-node="{esc(node.id)}" '
            f'data-state="{esc(node.state)}"><title>{esc(tip)}</title>'
            f'<rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="6" '
            f'fill="{style.fill}" stroke="{style.stroke}" stroke-width="2"{dash}/>'
            f'<text x="{x + BOX_W // 2}" y="{y + 19}" text-anchor="middle" font-size="13" '
            f'font-weight="600" fill="#111827">{esc(_label(node.id))}</text>'
            f'<text x="{x + BOX_W // 2}" y="{y + 35}" text-anchor="middle" font-size="11" '
            f'fill="#374151">{esc(node.state)}</text></g>'
        )
        if node.task_id:
            href = task_href.replace("{task_id}", quote(node.task_id, safe=""))
            box = f'<a href="{esc(href)}" class="dag-node-link">{box}</a>'
        out.append(box)
    out.append("</g></svg>")
    return "".join(out)
