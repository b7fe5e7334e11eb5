"""Undirected pairwise graphs over labels, and the contraction schedules of trees.

A ``Graph`` holds ``num_nodes`` and an edge index ``edges`` of shape ``[E, 2]`` (one graph)
or ``[T, E, 2]`` (an ensemble of ``T`` graphs over the same nodes, e.g. random spanning
trees). Edges are undirected, ``i != j``, without duplicates.

Tree ops run on a *contraction schedule* (rake leaves into parents, compress unary chains)
computed once per graph and cached per device: its depth is O(log n) on any tree,
paths included, so inference costs O(log n) batched tensor operations.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import torch
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

__all__ = ["ArgumentTypeError", "Graph", "Schedule", "Step", "check_bool", "check_float", "check_int",
           "choose_schedule", "component_labels", "contraction_steps", "root_forest"]

S = TypeVar("S")  # a schedule: ``steps``, ``num_raked``, ``num_compressed``


@dataclass(frozen=True)
class Step:
    """One batched contraction step over the node slots of a forest.

    ``kind == "rake"``: leaves ``node`` fold into their current ``parent``.
    ``kind == "compress"``: ``node`` (exactly one live child ``child``) is spliced out;
    ``child``'s edge to ``node`` and ``node``'s edge to ``parent`` become one edge.
    All index tensors are LongTensor ``[S]``.
    """

    kind: str
    node: torch.Tensor
    parent: torch.Tensor
    child: torch.Tensor | None = None


@dataclass(frozen=True)
class Schedule:
    """Contraction schedule of a forest with ``N`` node slots (all graphs of an ensemble).

    parent: LongTensor [N]; the parent slot of v in the rooted forest (-1 for roots).
    parent_edge: LongTensor [N]; edge slot joining v to its parent (-1 for roots).
    flip: BoolTensor [N]; True when the edge is stored as (v, parent) rather than (parent, v).
    children: LongTensor [N - R]; the non-root slots. flipped: LongTensor; the slots with flip True.
    roots: LongTensor [R]; root_group: LongTensor [R], the graph (ensemble member) of each root.
    steps: the rake / compress steps, in order; num_raked / num_compressed: nodes they remove.
    memo: what the backends derive from the schedule (compiled programs, the fused kernels' arrays), kept
    with it and freed with it (a schedule lives in its graph's cache).
    """

    num_slots: int
    num_groups: int
    parent: torch.Tensor
    parent_edge: torch.Tensor
    flip: torch.Tensor
    children: torch.Tensor
    flipped: torch.Tensor
    roots: torch.Tensor
    root_group: torch.Tensor
    steps: tuple[Step, ...]
    num_raked: int = 0
    num_compressed: int = 0
    memo: dict = field(default_factory=dict, compare=False, repr=False)

    def to(self, device: torch.device) -> Schedule:
        def mv(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device)

        steps = tuple(Step(s.kind, mv(s.node), mv(s.parent), mv(s.child)) for s in self.steps)
        return Schedule(
            self.num_slots,
            self.num_groups,
            mv(self.parent),
            mv(self.parent_edge),
            mv(self.flip),
            mv(self.children),
            mv(self.flipped),
            mv(self.roots),
            mv(self.root_group),
            steps,
            self.num_raked,
            self.num_compressed,
        )


class Graph:
    """An undirected graph (edges [E, 2]) or an ensemble of graphs (edges [T, E, 2]) on n nodes."""

    def __init__(self, num_nodes: int, edges: torch.Tensor | np.ndarray | list) -> None:
        n = check_int(num_nodes, "num_nodes", 1)
        edges = _as_edge_tensor(edges)
        if edges.dim() not in (2, 3) or edges.shape[-1] != 2:
            raise ValueError(f"edges must have shape [E, 2] or [T, E, 2], got {tuple(edges.shape)}")
        if edges.dim() == 3 and edges.shape[0] == 0:
            raise ValueError("edges of shape [T, E, 2] must hold T >= 1 graphs, got T = 0")
        edges = edges.detach().to(torch.long).cpu().contiguous()
        if edges.numel() and (edges.min() < 0 or edges.max() >= n):
            raise ValueError(f"edges index out of range: every endpoint must lie in [0, {n}), "
                             f"got min {int(edges.min())}, max {int(edges.max())}")
        if (edges[..., 0] == edges[..., 1]).any():
            raise ValueError("edges contain a self-loop (i == j); edges must join distinct nodes")
        lo, hi = edges.amin(-1), edges.amax(-1)
        key = lo * n + hi
        if key.shape[-1] and (key.sort(-1).values.diff(dim=-1) == 0).any():
            raise ValueError("edges contain a duplicate undirected edge")
        self.num_nodes = n
        self.edges = edges
        self._cache: dict = {}

    # ------------------------------------------------------------------ basic properties
    @property
    def num_edges(self) -> int:
        return int(self.edges.shape[-2])

    @property
    def is_ensemble(self) -> bool:
        """True when edges is [T, E, 2]: T graphs on the same nodes."""
        return self.edges.dim() == 3

    @property
    def num_graphs(self) -> int:
        """T for an ensemble, 1 otherwise."""
        return int(self.edges.shape[0]) if self.is_ensemble else 1

    def edge_lists(self) -> list[np.ndarray]:
        """The edges [E, 2] of each graph of the ensemble (one for a single graph), as numpy arrays."""
        e = self.edges.numpy()
        return list(e) if self.is_ensemble else [e]

    def _components(self) -> list[np.ndarray]:
        """Connected-component label per node, for each graph of the ensemble."""
        if "components" not in self._cache:
            self._cache["components"] = [component_labels(self.num_nodes, e) for e in self.edge_lists()]
        return self._cache["components"]

    @property
    def num_components(self) -> int | list[int]:
        counts = [int(c.max()) + 1 for c in self._components()]
        return counts if self.is_ensemble else counts[0]

    @property
    def is_forest(self) -> bool:
        """No cycle (in every graph of an ensemble): |E| + c = n."""
        return all(len(e) + int(c.max()) + 1 == self.num_nodes
                   for e, c in zip(self.edge_lists(), self._components()))

    @property
    def is_tree(self) -> bool:
        """Connected and acyclic (every graph of an ensemble)."""
        return self.is_forest and all(int(c.max()) == 0 for c in self._components())

    def __repr__(self) -> str:
        shape = "x".join(map(str, self.edges.shape[:-1]))
        return f"Graph(num_nodes={self.num_nodes}, edges=[{shape}, 2])"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Graph) and other.num_nodes == self.num_nodes
                and other.edges.shape == self.edges.shape and bool((other.edges == self.edges).all()))

    __hash__ = object.__hash__

    # ------------------------------------------------------------------ constructors
    @staticmethod
    def complete(n: int) -> Graph:
        """All n(n-1)/2 pairs (i < j), in lexicographic order. n: int >= 1 (ValueError otherwise)."""
        n = check_int(n, "n", 1)
        i, j = torch.triu_indices(n, n, offset=1)
        return Graph(n, torch.stack([i, j], 1))

    @staticmethod
    def chain(n: int) -> Graph:
        """Path 0 - 1 - ... - (n-1). n: int >= 1 (ValueError otherwise); chain(1) is one node, no edge."""
        n = check_int(n, "n", 1)
        i = torch.arange(n - 1)
        return Graph(n, torch.stack([i, i + 1], 1))

    @staticmethod
    def star(n: int) -> Graph:
        """Node 0 joined to every other node. n: int >= 1 (ValueError otherwise); star(1) has no edge."""
        n = check_int(n, "n", 1)
        j = torch.arange(1, n)
        return Graph(n, torch.stack([torch.zeros_like(j), j], 1))

    @staticmethod
    def grid(h: int, w: int) -> Graph:
        """4-connected h x w grid, node index r * w + c; horizontal edges first, then vertical.

        h, w: ints >= 1 (ValueError otherwise).
        """
        h, w = check_int(h, "h", 1), check_int(w, "w", 1)
        idx = torch.arange(h * w).reshape(h, w)
        horiz = torch.stack([idx[:, :-1].reshape(-1), idx[:, 1:].reshape(-1)], 1)
        vert = torch.stack([idx[:-1, :].reshape(-1), idx[1:, :].reshape(-1)], 1)
        return Graph(h * w, torch.cat([horiz, vert]))

    @staticmethod
    def empty(n: int) -> Graph:
        """n isolated nodes (edges [0, 2]). n: int >= 1 (ValueError otherwise)."""
        return Graph(check_int(n, "n", 1), torch.zeros(0, 2, dtype=torch.long))

    @staticmethod
    def from_mask(mask: torch.Tensor, graph: Graph) -> Graph:
        """The subgraph of ``graph`` keeping the edges where ``mask`` (BoolTensor [E]) is True."""
        if not isinstance(graph, Graph):
            raise TypeError(f"graph must be a structtorch.Graph, got {type(graph).__name__}")
        mask = torch.as_tensor(mask).cpu()
        if mask.dtype != torch.bool:
            raise TypeError(f"mask must be a BoolTensor [E], got {mask.dtype}")
        if mask.shape != (graph.num_edges,) or graph.is_ensemble:
            raise ValueError(f"mask must have shape [{graph.num_edges}] for a single graph, "
                             f"got {tuple(mask.shape)}")
        return Graph(graph.num_nodes, graph.edges[mask])

    # ------------------------------------------------------------------ tree schedule
    def require_forest(self, op: str) -> None:
        """ValueError naming ``op`` (and the first offending member of an ensemble) unless acyclic."""
        if self._cache.get("forest"):  # checked once: a graph never changes
            return
        for t, (e, c) in enumerate(zip(self.edge_lists(), self._components())):
            if len(e) + int(c.max()) + 1 != self.num_nodes:
                where = f"member {t} of the ensemble {self!r}" if self.is_ensemble else f"the graph {self!r}"
                raise ValueError(f"{op} needs a tree or forest, but {where} has a cycle "
                                 f"(|E| = {len(e)} > n - #components = {self.num_nodes - int(c.max()) - 1}); "
                                 f"use smoothed_lp or brute_force_* for loopy graphs")
        self._cache["forest"] = True

    def require_spanning_trees(self, op: str) -> None:
        """ValueError naming ``op`` unless this is an ensemble of spanning trees: edges [T, n-1, 2], every
        member acyclic (with n - 1 edges, hence connected)."""
        n = self.num_nodes
        if not self.is_ensemble or self.num_edges != n - 1:
            got = list(self.edges.shape)
            raise ValueError(f"{op} needs an ensemble graph of spanning trees, edges [T, n-1, 2] = [T, {n - 1}, 2] "
                             f"for n = {n} nodes, got edges {got}")
        self.require_forest(op)

    def schedule(self, device: torch.device | str = "cpu", compress: bool = True) -> Schedule:
        """The contraction schedule of this forest (ensemble), built once and cached per device.

        compress=True: rake + compress rounds, O(log n) steps, O(n K^3) work per example.
        compress=False: rake only (leaves first, level by level), O(height) steps, O(n K^2) work.
        """
        self.require_forest("a tree op")
        return self.cached(("schedule", compress), device, lambda: _build_schedule(self, compress))

    def cached(self, name: object, device: torch.device | str, build):
        """A per-graph structure (schedule, colouring, ...) built once on the CPU by ``build()`` and
        cached per device (moved with its ``.to(device)``)."""
        device = torch.device(device)
        if (name, "cpu") not in self._cache:
            self._cache[(name, "cpu")] = build()
        if (name, str(device)) not in self._cache:
            self._cache[(name, str(device))] = self._cache[(name, "cpu")].to(device)
        return self._cache[(name, str(device))]


# ---------------------------------------------------------------------- schedule choice
def choose_schedule(build: Callable[[bool], S], raked: int, compressed: int, step_cost: dict[str, float],
                    unit_cost: dict[str, float], device: torch.device) -> S:
    """The rake + compress schedule ``build(True)`` (O(log n) steps) or the rake-only ``build(False)``
    (O(height) steps, less work per removed node), whichever a cost model estimates faster on ``device``:
    len(steps) * step_cost + (num_raked * raked + num_compressed * compressed) * unit_cost, with ``raked`` and
    ``compressed`` the work units (elements, candidates) of one removed node of the op and the costs (seconds)
    by device type ("cpu"; any other type reads "cuda"). Both schedules are exact: the model only decides
    speed. ``build(False)`` is not built when ``build(True)`` compresses nothing (the two are then the same)."""
    kind = device.type if device.type in step_cost else "cuda"

    def seconds(sched: S) -> float:
        work = sched.num_raked * raked + sched.num_compressed * compressed
        return len(sched.steps) * step_cost[kind] + work * unit_cost[kind]

    contract = build(True)
    if contract.num_compressed == 0:
        return contract
    levels = build(False)
    return levels if seconds(levels) < seconds(contract) else contract


# ---------------------------------------------------------------------- argument checks
class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type: a TypeError that is also a ValueError (most of the package's argument checks
    raised ValueError for a bad type too before ``check_int`` / ``check_float`` served them all)."""


def check_int(value: object, name: str, minimum: int | None = None, maximum: int | None = None,
              expected: str | None = None) -> int:
    """``value`` as an int (a Python or numpy integer, not a bool) in [minimum, maximum] (None: unbounded), else
    ``ArgumentTypeError`` (not an integer) or ValueError (out of range): "<name> must be <expected>, got <value>",
    ``expected`` by default "an int" (type) or ">= minimum" / "<= maximum" / "in [minimum, maximum]" (range)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ArgumentTypeError(f"{name} must be {expected or 'an int'}, got {type(value).__name__} {value!r}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        bounds = f"in [{minimum}, {maximum}]" if minimum is not None and maximum is not None \
            else f">= {minimum}" if minimum is not None else f"<= {maximum}"
        raise ValueError(f"{name} must be {expected or bounds}, got {value!r}")
    return int(value)


def check_bool(value: object, name: str) -> bool:
    """``value`` if it is a bool, else ValueError: "<name> must be a bool, got <value>"."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r}")
    return value


def check_float(value: object, name: str, minimum: float | None = None, strict: bool = True, finite: bool = False,
                expected: str | None = None) -> float:
    """``value`` as a float (a real number: Python or numpy, not a bool), > ``minimum`` (>= when not ``strict``; NaN
    never passes a bound) and finite if ``finite``, else ``ArgumentTypeError`` (not a real number) or ValueError:
    "<name> must be <expected>, got <value>", ``expected`` by default "a [finite] number [> minimum]"."""
    what = expected or " ".join(["a", *(["finite"] if finite else []), "number",
                                 *([f"{'>' if strict else '>='} {minimum:g}"] if minimum is not None else [])])
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(f"{name} must be {what}, got {type(value).__name__} {value!r}")
    low = minimum is None or (value > minimum if strict else value >= minimum)
    if not low or (finite and not math.isfinite(value)):
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return float(value)


def _as_edge_tensor(edges: object) -> torch.Tensor:
    """edges (tensor, array or nested list) as an integer tensor; TypeError for anything else."""
    bad = TypeError(f"edges must be an integer tensor of shape [E, 2] or [T, E, 2], got {type(edges).__name__}")
    if not isinstance(edges, torch.Tensor):
        if not isinstance(edges, (np.ndarray, list, tuple)):
            raise bad
        try:
            edges = torch.as_tensor(np.asarray(edges, dtype=np.int64).reshape(-1, 2) if len(edges) == 0
                                    else np.asarray(edges))
        except (TypeError, ValueError, RuntimeError) as err:
            raise bad from err
    if edges.dtype.is_floating_point or edges.dtype == torch.bool or edges.is_complex():
        raise TypeError(f"edges must be an integer tensor of shape [E, 2] or [T, E, 2], got {edges.dtype}")
    return edges


# ---------------------------------------------------------------------- helpers (numpy, once per graph)
def component_labels(n: int, edges: np.ndarray) -> np.ndarray:
    """The connected component [n] of each of n nodes joined by ``edges`` [E, 2]: components numbered 0, 1, ...
    in the order of their smallest node."""
    adj = coo_matrix((np.ones(len(edges)), (edges[:, 0], edges[:, 1])), shape=(n, n))
    return connected_components(adj, directed=False)[1]


def root_forest(n: int, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """BFS-root every component at its lowest node: parent [n], parent_edge [n], flip [n]."""
    adj: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for e, (a, b) in enumerate(edges):
        adj[a].append((b, e))
        adj[b].append((a, e))
    parent = np.full(n, -1)
    parent_edge = np.full(n, -1)
    seen = np.zeros(n, dtype=bool)
    for r in range(n):
        if seen[r]:
            continue
        seen[r] = True
        frontier = [r]
        while frontier:
            nxt = []
            for v in frontier:
                for u, e in adj[v]:
                    if not seen[u]:
                        seen[u] = True
                        parent[u], parent_edge[u] = v, e
                        nxt.append(u)
            frontier = nxt
    flip = np.zeros(n, dtype=bool)
    has_parent = parent >= 0
    flip[has_parent] = edges[parent_edge[has_parent], 0] != parent[has_parent]
    return parent, parent_edge, flip


def _build_schedule(graph: Graph, compress: bool = True) -> Schedule:
    n, lists = graph.num_nodes, graph.edge_lists()
    num_edges = graph.num_edges
    parents, pedges, flips, groups = [], [], [], []
    for t, e in enumerate(lists):
        p, pe, f = root_forest(n, e)
        parents.append(np.where(p >= 0, p + t * n, -1))
        pedges.append(np.where(pe >= 0, pe + t * num_edges, -1))
        flips.append(f)
        groups.append(np.full(n, t))
    parent = np.concatenate(parents)
    group = np.concatenate(groups)
    steps = contraction_steps(parent, compress)
    roots = np.flatnonzero(parent < 0)
    flip = np.concatenate(flips)
    as_long = lambda a: torch.as_tensor(np.asarray(a, dtype=np.int64))  # noqa: E731
    return Schedule(
        num_slots=len(parent),
        num_groups=len(lists),
        parent=as_long(parent),
        parent_edge=as_long(np.concatenate(pedges)),
        flip=torch.as_tensor(flip),
        children=as_long(np.flatnonzero(parent >= 0)),
        flipped=as_long(np.flatnonzero(flip)),
        roots=as_long(roots),
        root_group=as_long(group[roots]),
        steps=tuple(
            Step(kind, as_long(node), as_long(par), None if ch is None else as_long(ch))
            for kind, node, par, ch in steps
        ),
        num_raked=sum(len(node) for kind, node, _, _ in steps if kind == "rake"),
        num_compressed=sum(len(node) for kind, node, _, _ in steps if kind == "compress"),
    )


def contraction_steps(parent: np.ndarray, compress: bool = True) -> list[tuple]:
    """Rake/compress rounds (Miller-Reif tree contraction) until only roots remain.

    Each round rakes the live non-root leaves (except a leaf whose parent is itself a non-root
    node with one child: compressing that parent carries the leaf up instead), then compresses
    an independent set of the live non-root nodes with exactly one live child (even positions
    within each run of such nodes), so any tree, a path included, contracts in O(log n) rounds:
    a path takes log2(n) compress steps and one rake.
    Without ``compress`` only the rakes remain: one step per level of height.
    """
    parent = parent.copy()
    n = len(parent)
    live = np.ones(n, dtype=bool)
    steps: list[tuple] = []
    while True:
        nonroot = live & (parent >= 0)
        if not nonroot.any():
            return steps
        children = np.bincount(parent[nonroot], minlength=n)
        leaf = nonroot & (children == 0)
        if compress:  # a leaf under a single-child non-root node rides up with that node's compression
            par = np.where(parent >= 0, parent, 0)
            leaf &= ~((parent[par] >= 0) & (children[par] == 1))
        leaves = np.flatnonzero(leaf)
        if len(leaves):
            steps.append(("rake", leaves, parent[leaves], None))
            live[leaves] = False
            children = np.bincount(parent[live & (parent >= 0)], minlength=n)
        nonroot = live & (parent >= 0)
        cand = nonroot & (children == 1)
        if not compress or not cand.any():
            continue
        # the one live child of each candidate
        kids = np.flatnonzero(live & (parent >= 0))
        only_child = np.full(n, -1)
        only_child[parent[kids]] = kids
        # position within a run of candidates, counted from the top of the run: take even positions
        run_pos = _run_position(parent, cand)
        chosen = np.flatnonzero(cand & (run_pos % 2 == 0))
        steps.append(("compress", chosen, parent[chosen], only_child[chosen]))
        live[chosen] = False
        parent[only_child[chosen]] = parent[chosen]


def _run_position(parent: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """For each candidate, how many candidates stand directly above it (pointer jumping)."""
    idx = np.arange(len(parent))
    par = np.where(parent >= 0, parent, idx)
    up = np.where(cand & cand[par], par, idx)
    dist = (up != idx).astype(np.int64)
    while True:
        nxt = up[up]
        if (nxt == up).all():
            return dist
        dist = dist + dist[up] * (up != idx)
        up = nxt
