"""Graph: constructors, flags, components, ensembles, validation, cached contraction schedules."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import edge_tensor, ensemble_graphs, graphs, tree_edges
from hypothesis import given, settings
from hypothesis import strategies as st

from structtorch import Graph


def log_steps_bound(n: int) -> float:
    return 4 * math.log2(max(n, 2)) + 4


def edge_set(g: Graph) -> set[tuple[int, int]]:
    return {(int(a), int(b)) for a, b in g.edges}


# ---------------------------------------------------------------------- constructors and flags
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_complete(n):
    g = Graph.complete(n)
    assert g.num_nodes == n and g.num_edges == n * (n - 1) // 2
    assert edge_set(g) == {(i, j) for i in range(n) for j in range(i + 1, n)}
    assert g.is_tree == (n <= 2) and g.is_forest == (n <= 2)
    assert g.num_components == 1


@pytest.mark.parametrize("n", [1, 2, 7, 100])
def test_chain(n):
    g = Graph.chain(n)
    assert g.num_edges == n - 1 and g.is_tree and g.is_forest and g.num_components == 1
    assert edge_set(g) == {(i, i + 1) for i in range(n - 1)}


@pytest.mark.parametrize("n", [1, 2, 6])
def test_star(n):
    g = Graph.star(n)
    assert g.num_edges == n - 1 and g.is_tree and g.num_components == 1
    assert edge_set(g) == {(0, j) for j in range(1, n)}


@pytest.mark.parametrize("h,w", [(1, 1), (1, 5), (4, 1), (2, 2), (3, 4)])
def test_grid(h, w):
    g = Graph.grid(h, w)
    assert g.num_nodes == h * w
    assert g.num_edges == h * (w - 1) + (h - 1) * w
    assert g.is_tree == (h == 1 or w == 1) and g.is_forest == (h == 1 or w == 1)
    assert g.num_components == 1
    for a, b in g.edges.tolist():  # 4-neighbours, node index r * w + c
        (ra, ca), (rb, cb) = divmod(a, w), divmod(b, w)
        assert abs(ra - rb) + abs(ca - cb) == 1


def test_empty_graph_is_a_forest_of_isolated_nodes():
    g = Graph.empty(5)
    assert g.num_edges == 0 and g.is_forest and not g.is_tree and g.num_components == 5
    assert Graph(1, []).is_tree


def test_forest_and_cycle_flags():
    forest = Graph(6, [[0, 1], [2, 3], [3, 4]])
    assert forest.is_forest and not forest.is_tree and forest.num_components == 3
    cycle = Graph(4, [[0, 1], [1, 2], [2, 0]])
    assert not cycle.is_forest and not cycle.is_tree and cycle.num_components == 2


def test_edges_from_list_and_numpy():
    a = Graph(3, [[0, 1], [1, 2]])
    b = Graph(3, np.array([[0, 1], [1, 2]], dtype=np.int32))
    assert a == b and a.edges.dtype == torch.long
    assert a != Graph(3, [[1, 0], [1, 2]])


def test_from_mask():
    g = Graph.complete(4)
    mask = torch.tensor([True, False, False, True, False, True])
    sub = Graph.from_mask(mask, g)
    assert sub.num_nodes == 4 and sub.edges.tolist() == [[0, 1], [1, 2], [2, 3]] and sub.is_tree
    with pytest.raises(ValueError, match=r"mask must have shape \[6\]"):
        Graph.from_mask(torch.ones(5, dtype=torch.bool), g)


@settings(max_examples=40, deadline=None)
@given(graphs(max_nodes=12))
def test_random_forest_flags_match_union_find(g):
    labels = list(range(g.num_nodes))

    def find(a):
        while labels[a] != a:
            a = labels[a]
        return a

    for a, b in g.edges.tolist():
        labels[find(a)] = find(b)
    components = len({find(v) for v in range(g.num_nodes)})
    assert g.num_components == components
    assert g.is_forest and g.num_edges == g.num_nodes - components
    assert g.is_tree == (components == 1)


# ---------------------------------------------------------------------- ensembles
def test_ensemble_graph():
    edges = torch.tensor([[[0, 1], [1, 2], [2, 3]], [[0, 2], [2, 1], [3, 1]]])
    g = Graph(4, edges)
    assert g.is_ensemble and g.num_graphs == 2 and g.num_edges == 3
    assert g.is_tree and g.is_forest and g.num_components == [1, 1]
    assert not Graph.chain(4).is_ensemble and Graph.chain(4).num_graphs == 1


def test_ensemble_with_a_cycle_or_forest_member():
    g = Graph(4, torch.tensor([[[0, 1], [1, 2], [2, 3]], [[0, 1], [1, 2], [2, 0]]]))
    assert not g.is_forest and not g.is_tree and g.num_components == [1, 2]
    f = Graph(4, torch.tensor([[[0, 1], [2, 3]], [[0, 1], [1, 2]]]))
    assert f.is_forest and not f.is_tree and f.num_components == [2, 2]


def test_ensemble_members_may_share_edges():
    g = Graph(3, torch.tensor([[[0, 1], [1, 2]], [[1, 0], [1, 2]]]))
    assert g.is_tree


@settings(max_examples=25, deadline=None)
@given(ensemble_graphs(max_nodes=8))
def test_random_ensembles_are_trees(g):
    assert g.edges.shape == (g.num_graphs, g.num_nodes - 1, 2)
    assert g.is_tree and g.num_components == [1] * g.num_graphs


# ---------------------------------------------------------------------- validation
def test_self_loop_rejected():
    with pytest.raises(ValueError, match="self-loop"):
        Graph(3, [[0, 1], [2, 2]])


@pytest.mark.parametrize("edges", [[[0, 1], [0, 1]], [[0, 1], [1, 0]], [[2, 1], [0, 1], [1, 2]]])
def test_duplicate_edge_rejected(edges):
    with pytest.raises(ValueError, match="duplicate"):
        Graph(3, edges)


def test_duplicate_edge_within_ensemble_member_rejected():
    with pytest.raises(ValueError, match="duplicate"):
        Graph(3, torch.tensor([[[0, 1], [1, 2]], [[0, 2], [2, 0]]]))


@pytest.mark.parametrize("edges", [[[0, 3]], [[0, 1], [-1, 2]], [[5, 6]]])
def test_edge_index_out_of_range_rejected(edges):
    with pytest.raises(ValueError, match=r"out of range.*\[0, 3\)"):
        Graph(3, edges)


@pytest.mark.parametrize("edges", [[[0.0, 1.0]], torch.tensor([[0.0, 1.0]]), torch.tensor([[True, False]])])
def test_non_integer_edges_rejected(edges):
    with pytest.raises(TypeError, match="edges must be an integer tensor"):
        Graph(3, edges)


@pytest.mark.parametrize("shape", [(2,), (2, 3), (1, 1, 1, 2), (3, 1)])
def test_wrong_edge_shape_rejected(shape):
    with pytest.raises(ValueError, match=r"edges must have shape \[E, 2\] or \[T, E, 2\]"):
        Graph(3, torch.zeros(shape, dtype=torch.long))


@pytest.mark.parametrize("n", [0, -2])
def test_num_nodes_below_one_rejected(n):
    with pytest.raises(ValueError, match="num_nodes must be >= 1"):
        Graph(n, [])


@pytest.mark.parametrize("n", [3.0, True, "3"])
def test_num_nodes_not_int_rejected(n):
    with pytest.raises(TypeError, match="num_nodes must be an int"):
        Graph(n, [])


def test_schedule_of_cyclic_graph_rejected():
    with pytest.raises(ValueError, match="needs a tree or forest"):
        Graph.grid(2, 2).schedule()


# ---------------------------------------------------------------------- schedule
def test_schedule_is_cached():
    g = Graph.chain(10)
    s = g.schedule()
    assert g.schedule() is s
    assert g.schedule("cpu") is s and g.schedule(torch.device("cpu")) is s


def path_graph(n: int, seed: int) -> Graph:
    """A path on a random relabelling of 0..n-1, random edge orientations and edge order."""
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=gen)
    e = torch.stack([perm[:-1], perm[1:]], 1)
    flip = torch.rand(n - 1, generator=gen) < 0.5
    e = torch.where(flip[:, None], e.flip(1), e)
    return Graph(n, e[torch.randperm(n - 1, generator=gen)])


@pytest.mark.parametrize("graph", [Graph.chain(1024), path_graph(1024, 0), path_graph(1000, 1)],
                         ids=["chain", "relabelled-path", "odd-path"])
def test_path_schedule_has_logarithmic_depth(graph):
    steps = graph.schedule().steps
    assert len(steps) <= log_steps_bound(graph.num_nodes)
    assert {s.kind for s in steps} == {"rake", "compress"}


def test_star_schedule_is_one_rake():
    steps = Graph.star(1024).schedule().steps
    assert len(steps) == 1 and steps[0].kind == "rake" and len(steps[0].node) == 1023


def test_deep_random_tree_schedule_has_logarithmic_depth():
    gen = torch.Generator().manual_seed(3)
    n = 2000
    parents = [max(0, i - 1 - int(torch.randint(0, 3, (1,), generator=gen))) for i in range(1, n)]
    g = Graph(n, torch.tensor([[p, i + 1] for i, p in enumerate(parents)]))
    assert len(g.schedule().steps) <= log_steps_bound(n)


def replay_schedule(g: Graph) -> None:
    """Check that the schedule is a valid contraction: every step removes live nodes of the
    right kind (leaves for rake, single-child nodes for compress) and only roots remain."""
    sched = g.schedule()
    parent = sched.parent.tolist()
    live = [True] * sched.num_slots

    def live_children(v):
        return [c for c in range(sched.num_slots) if live[c] and parent[c] == v]

    for step in sched.steps:
        nodes = step.node.tolist()
        assert len(set(nodes)) == len(nodes)
        assert all(live[v] and parent[v] >= 0 for v in nodes)
        assert step.parent.tolist() == [parent[v] for v in nodes]
        assert not set(nodes) & set(step.parent.tolist())
        if step.kind == "rake":
            assert all(not live_children(v) for v in nodes)
        else:
            assert step.kind == "compress"
            assert [live_children(v) for v in nodes] == [[c] for c in step.child.tolist()]
            for v, c in zip(nodes, step.child.tolist()):
                parent[c] = parent[v]
        for v in nodes:
            live[v] = False
    assert [v for v in range(sched.num_slots) if live[v]] == sched.roots.tolist()
    assert all(parent[r] == -1 for r in sched.roots.tolist())


@settings(max_examples=40, deadline=None)
@given(st.one_of(graphs(max_nodes=40), ensemble_graphs(max_nodes=20)))
def test_schedule_is_a_valid_logarithmic_contraction(g):
    replay_schedule(g)
    sched = g.schedule()
    assert sched.num_slots == g.num_nodes * g.num_graphs and sched.num_groups == g.num_graphs
    assert len(sched.roots) == sum(np.atleast_1d(g.num_components))
    assert len(sched.steps) <= log_steps_bound(g.num_nodes) + 2


@settings(max_examples=20, deadline=None)
@given(st.integers(2, 60).flatmap(tree_edges))
def test_schedule_parent_edges_are_the_graph_edges(edges):
    g = Graph(len(edges) + 1, edge_tensor(edges))
    sched = g.schedule()
    for v in range(g.num_nodes):
        p, e = int(sched.parent[v]), int(sched.parent_edge[v])
        if p < 0:
            assert e == -1
            continue
        stored = g.edges[e].tolist()
        assert sorted(stored) == sorted([p, v])
        assert bool(sched.flip[v]) == (stored[0] != p)


# ---------------------------------------------------------------------- odd sizes and bad arguments
@pytest.mark.parametrize("make", [Graph.chain, Graph.star, Graph.complete, Graph.empty])
@pytest.mark.parametrize("n", [0, -1, -7])
def test_constructors_reject_fewer_than_one_node(make, n):
    with pytest.raises(ValueError, match=rf"n must be >= 1, got {n}"):
        make(n)


@pytest.mark.parametrize("make", [Graph.chain, Graph.star, Graph.complete, Graph.empty])
@pytest.mark.parametrize("n", [2.0, "3", None, True])
def test_constructors_reject_non_int_sizes(make, n):
    with pytest.raises(TypeError, match="n must be an int"):
        make(n)


@pytest.mark.parametrize("make", [Graph.chain, Graph.star, Graph.complete, Graph.empty])
def test_constructors_on_one_node_give_one_node_without_edges(make):
    g = make(1)
    assert g.num_nodes == 1 and g.edges.shape == (0, 2) and g.is_tree
    assert make(np.int64(3)).num_nodes == 3  # numpy ints are ints


def test_argument_checks_name_the_argument_what_was_expected_and_what_came():
    from structtorch.graph import ArgumentTypeError, check_float, check_int

    assert check_int(np.int64(3), "k", 1, 3) == 3 and check_float(np.float32(0.5), "eps", 0.0) == 0.5
    with pytest.raises(ArgumentTypeError, match="k must be a positive int, got float 1.5") as bad_type:
        check_int(1.5, "k", 1, expected="a positive int")
    assert isinstance(bad_type.value, TypeError) and isinstance(bad_type.value, ValueError)
    with pytest.raises(ValueError, match=r"fold must be in \[0, 2\], got 3"):
        check_int(3, "fold", 0, 2)
    with pytest.raises(ArgumentTypeError, match="tol must be a number >= 0, got bool True"):
        check_float(True, "tol", 0.0, strict=False)
    for value in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError, match="eps must be a number > 0"):
            check_float(value, "eps", 0.0)
    with pytest.raises(ValueError, match="scale must be a finite number, got inf"):
        check_float(math.inf, "scale", finite=True)


@pytest.mark.parametrize("h,w,name", [(0, 3, "h"), (3, 0, "w"), (-2, 2, "h"), (2, -1, "w")])
def test_grid_rejects_empty_sides(h, w, name):
    with pytest.raises(ValueError, match=rf"{name} must be >= 1"):
        Graph.grid(h, w)
    with pytest.raises(TypeError, match=rf"{name} must be an int"):
        Graph.grid(*((2.5, 2) if name == "h" else (2, 2.5)))


def test_grid_with_one_row_is_a_chain():
    assert Graph.grid(1, 4) == Graph.chain(4)
    assert Graph.grid(1, 1).num_edges == 0


@pytest.mark.parametrize("edges", [None, "ab", {0: 1}, 3, [[0, "a"]]])
def test_non_tensor_edges_raise_type_error(edges):
    with pytest.raises(TypeError, match=r"edges must be an integer tensor of shape \[E, 2\]"):
        Graph(3, edges)


def test_ensemble_of_zero_graphs_rejected():
    with pytest.raises(ValueError, match="T >= 1 graphs, got T = 0"):
        Graph(3, torch.zeros(0, 2, 2, dtype=torch.long))


def test_from_mask_needs_a_bool_mask_and_a_graph():
    g = Graph.complete(3)
    with pytest.raises(TypeError, match="mask must be a BoolTensor"):
        Graph.from_mask(torch.tensor([0.5, 0.0, 1.0]), g)
    with pytest.raises(TypeError, match="graph must be a structtorch.Graph"):
        Graph.from_mask(torch.ones(3, dtype=torch.bool), "complete")
    assert Graph.from_mask([True, False, True], g).edges.tolist() == [[0, 1], [1, 2]]


def test_require_forest_names_the_cyclic_member_of_an_ensemble():
    g = Graph(4, torch.tensor([[[0, 1], [1, 2], [2, 3]], [[0, 1], [1, 2], [0, 2]]]))
    with pytest.raises(ValueError, match=r"op needs a tree or forest, but member 1 of the ensemble.*cycle"):
        g.require_forest("op")
    Graph(4, g.edges[:1]).require_forest("op")  # member 0 alone is fine


def test_require_spanning_trees():
    Graph(4, torch.tensor([[[0, 1], [1, 2], [2, 3]], [[0, 3], [1, 3], [2, 3]]])).require_spanning_trees("op")
    Graph(1, torch.zeros(2, 0, 2, dtype=torch.long)).require_spanning_trees("op")  # one node: empty trees
    with pytest.raises(ValueError, match=r"op needs an ensemble graph of spanning trees, edges \[T, n-1, 2\] = "
                                         r"\[T, 3, 2\] for n = 4 nodes, got edges \[2, 2, 2\]"):
        Graph(4, torch.tensor([[[0, 1], [1, 2]], [[0, 1], [2, 3]]])).require_spanning_trees("op")
    with pytest.raises(ValueError, match=r"got edges \[3, 2\]"):
        Graph.chain(4).require_spanning_trees("op")
    with pytest.raises(ValueError, match="member 0 of the ensemble.*cycle"):
        Graph(4, torch.tensor([[[0, 1], [1, 2], [0, 2]]])).require_spanning_trees("op")
