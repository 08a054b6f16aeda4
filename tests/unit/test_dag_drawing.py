"""The dashboard's DAG drawing: layering, order within layers, and the SVG it renders."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from reach.core.orchestration.dags import DagSpec, NodeSpec
from reach.core.orchestration.dags.drawing import (
    BOX_H,
    BOX_W,
    MAX_LABEL,
    STATE_STYLES,
    GraphNode,
    crossings,
    graph_of,
    layers,
    layout,
    order_layers,
    render_svg,
)
from reach.errors import DagError

SVG = "{http://www.w3.org/2000/svg}"


def g(spec: str) -> list[GraphNode]:
    """``"a b:a c:a,b"``: nodes in declaration order, each with its dependencies."""
    out = []
    for word in spec.split():
        node_id, _, deps = word.partition(":")
        out.append(GraphNode(node_id, tuple(d for d in deps.split(",") if d)))
    return out


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ("a", [["a"]]),
        ("a b:a c:b", [["a"], ["b"], ["c"]]),  # chain
        ("a b:a c:a d:b,c", [["a"], ["b", "c"], ["d"]]),  # diamond
        ("a b:a c:a d:a", [["a"], ["b", "c", "d"]]),  # fan-out
        ("a b c:a,b", [["a", "b"], ["c"]]),  # fan-in, two roots
        ("a b:a lone", [["a", "lone"], ["b"]]),  # an isolated node is a root
        ("a b:a c:a,b", [["a"], ["b"], ["c"]]),  # longest path, not the shortest
        ("c:b b:a a", [["a"], ["b"], ["c"]]),  # declared downstream first
        ("a b:a,ghost", [["a"], ["b"]]),  # a dependency not drawn is ignored
        ("", []),
    ],
    ids=[
        "single", "chain", "diamond", "fan-out", "fan-in", "isolated", "longest-path",
        "declared-backwards", "unknown-dependency", "empty",
    ],
)  # fmt: skip
def test_layers(graph: str, expected: list[list[str]]) -> None:
    assert [list(layer) for layer in layers(g(graph))] == expected


def test_a_cycle_is_refused_naming_its_nodes() -> None:
    with pytest.raises(DagError, match="cycle among: a, b"):
        layers(g("a:b b:a c"))


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        # c hangs under b and d under a: declared c first, they would cross
        ("a b c:b d:a", [["a", "b"], ["d", "c"]]),
        ("a b:a c:a d:b,c", [["a"], ["b", "c"], ["d"]]),  # nothing to improve: unchanged
        # the second layer's order follows its roots; the third follows the second
        ("a b x:b y:a p:x q:y", [["a", "b"], ["y", "x"], ["q", "p"]]),
    ],
    ids=["swap", "diamond-kept", "two-layers"],
)
def test_order_within_layers_reduces_crossings(graph: str, expected: list[list[str]]) -> None:
    nodes = g(graph)
    ordered = order_layers(nodes)
    assert [list(layer) for layer in ordered] == expected
    edges = [(d, n.id) for n in nodes for d in n.dependencies]
    assert crossings(ordered, edges) <= crossings(layers(nodes), edges)


@pytest.mark.parametrize(
    ("order", "edges", "expected"),
    [
        ([["a", "b"], ["c", "d"]], [("a", "d"), ("b", "c")], 1),
        ([["a", "b"], ["c", "d"]], [("a", "c"), ("b", "d")], 0),
        ([["a", "b"], ["c", "d"]], [("a", "c"), ("a", "d")], 0),  # sharing an end
        # a long edge a->z passes layer 1 at row 0.5, between x (0) and y (1)
        ([["a", "b"], ["x", "y"], ["w", "z"]], [("a", "z"), ("b", "x")], 1),
    ],
    ids=["crossed", "parallel", "shared-end", "long-edge"],
)
def test_crossings(order: list[list[str]], edges: list[tuple[str, str]], expected: int) -> None:
    assert crossings(order, edges) == expected


def test_layout_places_layers_left_to_right_and_centres_them() -> None:
    placed = layout(g("a b:a c:a d:b,c"))
    (ax, ay), (bx, by), (cx, cy), (dx, dy) = (placed.boxes[n] for n in "abcd")
    assert ax < bx == cx < dx
    assert by < cy and ay == dy == (by + cy) // 2
    assert all(0 <= x and x + BOX_W <= placed.width for x, _ in placed.boxes.values())
    assert all(0 <= y and y + BOX_H <= placed.height for _, y in placed.boxes.values())


def test_a_long_edge_goes_around_the_boxes_between() -> None:
    """a -> d skips two layers: it gets a slot in each, so it never crosses a box."""
    graph = g("a b:a c:b d:a,c")
    placed = layout(graph)
    assert [list(layer) for layer in placed.layers] == [["a"], ["b"], ["c"], ["d"]]
    through = placed.waypoints[("a", "d")]
    assert len(through) == 2 and placed.waypoints[("a", "b")] == ()
    for (x, y), box in zip(through, (placed.boxes["b"], placed.boxes["c"]), strict=True):
        assert x == box[0] and abs(y - box[1]) >= BOX_H  # same column, another row
    path = next(
        p.get("d", "")
        for p in _parse(render_svg(graph)).iter(f"{SVG}path")
        if (p.get("data-from"), p.get("data-to")) == ("a", "d")
    )
    ys = {int(y) for y in re.findall(r"L \d+ (\d+)", path)}
    assert ys == {y + BOX_H // 2 for _, y in through}  # straight across each slot
    assert path.startswith(f"M {placed.boxes['a'][0] + BOX_W} ")


def _parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)  # well-formed XML, or this raises


def _nodes(svg: str) -> dict[str, ET.Element]:
    return {
        el.get("data-node", ""): el for el in _parse(svg).iter(f"{SVG}g") if el.get("data-node")
    }


@pytest.mark.parametrize("state", sorted(STATE_STYLES))
def test_each_state_has_its_colour(state: str) -> None:
    svg = render_svg([GraphNode("a", state=state), GraphNode("b", ("a",))])
    box = _nodes(svg)["a"]
    rect = box.find(f"{SVG}rect")
    assert rect is not None
    assert box.get("data-state") == state
    assert rect.get("fill") == STATE_STYLES[state].fill
    assert rect.get("stroke") == STATE_STYLES[state].stroke
    assert (rect.get("stroke-dasharray") is not None) == (STATE_STYLES[state].dash is not None)


def test_states_are_told_apart() -> None:
    fills = {style.fill for style in STATE_STYLES.values()}
    assert len(fills) == len(STATE_STYLES)
    for required in ("pending", "running", "success", "failed", "skipped", "timeout"):
        assert required in STATE_STYLES
    assert "awaiting_approval" in STATE_STYLES


def test_an_unknown_state_is_drawn_not_refused() -> None:
    svg = render_svg([GraphNode("a", state="<weird>")])
    assert _nodes(svg)["a"].get("data-state") == "<weird>"
    assert "<weird>" not in svg


def test_names_and_details_are_escaped() -> None:
    nasty = '<script>alert("x")</script>&'
    svg = render_svg(
        [
            GraphNode("a<b&c", state="failed", detail=nasty, task_id="t&<1>"),
            GraphNode("d", ("a<b&c",)),
        ],
        title="run <1> & co",
    )
    root = _parse(svg)
    assert "<script>" not in svg and "a<b" not in svg
    assert "a&lt;b&amp;c" in svg
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "a<b&c" in texts  # escaped in the markup, itself once parsed
    titles = [t.text or "" for t in root.iter(f"{SVG}title")]
    assert any(nasty in t for t in titles)
    assert root.get("aria-label") == "run <1> & co"
    (link,) = root.iter(f"{SVG}a")
    assert link.get("href") == "/ui/tasks/t%26%3C1%3E"
    (edge,) = (p for p in root.iter(f"{SVG}path") if p.get("class") == "dag-edge")
    assert (edge.get("data-from"), edge.get("data-to")) == ("a<b&c", "d")


def test_a_long_name_is_cut_with_the_full_name_in_its_tooltip() -> None:
    name = "n" * 40
    root = _parse(render_svg([GraphNode(name)]))
    texts = [t.text or "" for t in root.iter(f"{SVG}text")]
    assert texts[0] == "n" * (MAX_LABEL - 1) + "\u2026"
    assert any(name in (t.text or "") for t in root.iter(f"{SVG}title"))


def test_nodes_with_a_task_link_to_its_page() -> None:
    svg = render_svg(
        [GraphNode("a", task_id="dag-1.a", state="success"), GraphNode("b", ("a",))],
        task_href="/ui/tasks/{task_id}",
    )
    links = list(_parse(svg).iter(f"{SVG}a"))
    assert [a.get("href") for a in links] == ["/ui/tasks/dag-1.a"]
    inner = links[0].find(f"{SVG}g")
    assert inner is not None and inner.get("data-node") == "a"


def test_edges_are_arrows_from_each_dependency() -> None:
    root = _parse(render_svg(g("a b:a c:a d:b,c")))
    paths = [p for p in root.iter(f"{SVG}path") if p.get("class") == "dag-edge"]
    assert sorted((p.get("data-from"), p.get("data-to")) for p in paths) == [
        ("a", "b"), ("a", "c"), ("b", "d"), ("c", "d"),
    ]  # fmt: skip
    assert all(p.get("marker-end") == "url(#dag-arrow)" for p in paths)
    assert root.find(f"{SVG}defs/{SVG}marker[@id='dag-arrow']") is not None
    # each edge leaves its source's right side and ends at its target's left side
    placed = layout(g("a b:a c:a d:b,c"))
    for p in paths:
        start = re.match(r"M (\d+) (\d+)", p.get("d", ""))
        assert start is not None
        sx, _ = placed.boxes[p.get("data-from", "")]
        assert int(start.group(1)) == sx + BOX_W


def test_the_drawing_is_deterministic() -> None:
    graph = g("a b c:b d:a e:c,d f lone:f")
    first = render_svg(graph)
    assert all(render_svg(g("a b c:b d:a e:c,d f lone:f")) == first for _ in range(5))
    assert render_svg(graph, title="x") != first  # and depends on what it is given


def test_graph_of_a_stored_run() -> None:
    spec = DagSpec(
        name="d",
        nodes=(
            NodeSpec(id="fetch", agent_id="x", method="m"),
            NodeSpec(id="report", agent_id="x", method="m", dependencies=("fetch",)),
        ),
    )
    nodes = graph_of(spec, {"fetch": "success"}, {"fetch": "t1"}, {"fetch": "succeeded"})
    assert nodes == [
        GraphNode("fetch", (), "success", "t1", "succeeded"),
        GraphNode("report", ("fetch",), "pending", None, ""),
    ]
