"""Where a parallel layer runs: a torch.distributed DeviceMesh with two named dimensions.

    "ep"  expert parallel: ranks along it hold different experts and different tokens
    "tp"  tensor parallel: ranks along it hold the same tokens and a slice I / tp of every expert
          they hold

    parallel_mesh(tp=8)          TP8 (ep = 1)
    parallel_mesh(ep=8)          EP8 (tp = 1)
    parallel_mesh(ep=2, tp=8)    the spec's DP2/TP8/EP2 hybrid: tp is the node dimension (its
                                 groups are the ranks of one host), ep crosses hosts

Communication deduplication (dispatch/ep.py) moves traffic from the ep dimension onto the tp
dimension, so tp groups should be the ranks that share fast links. Rank r of the world sits at
(r // tp, r % tp). Every group also has a gloo twin on the same ranks: the host-side agreement
on sizes before each forward (dispatch/comm.py) runs there without a device sync.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

DIMS = ("ep", "tp")


@dataclass(frozen=True)
class Mesh:
    device_mesh: DeviceMesh  # ("ep", "tp")
    ep: int
    tp: int
    ep_rank: int
    tp_rank: int
    groups: dict = field(repr=False)  # "ep" | "tp" | "all" -> device ProcessGroup
    cpu: dict = field(repr=False)  # the same keys -> gloo ProcessGroup on the same ranks

    @property
    def size(self) -> int:
        return self.ep * self.tp

    @property
    def rank(self) -> int:
        """This rank's index in the mesh (ep-major): ep_rank * tp + tp_rank."""
        return self.ep_rank * self.tp + self.tp_rank

    def describe(self) -> str:
        return f"ep={self.ep} x tp={self.tp}"


_CACHE: dict[tuple, Mesh] = {}


def _require_distributed(what: str) -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{what} needs torch.distributed to be initialized "
                           "(torch.distributed.init_process_group, e.g. under torchrun)")


def _device_type() -> str:
    return "cuda" if dist.get_backend() == "nccl" else "cpu"


def parallel_mesh(ep: int = 1, tp: int = 1) -> Mesh:
    """The (ep, tp) mesh over every rank of the default group (ep * tp = world size). Collective:
    every rank must call it with the same sizes; cached, so layers of one model share groups."""
    _require_distributed("parallel_mesh")
    world = dist.get_world_size()
    for name, n in (("ep", ep), ("tp", tp)):
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be a positive int, got {n!r}")
    if ep * tp != world:
        raise ValueError(f"ep * tp must equal the world size {world}, got ep={ep}, tp={tp}")
    key = (ep, tp, world, id(dist.group.WORLD))
    if key not in _CACHE:
        _CACHE[key] = _build(init_device_mesh(_device_type(), (ep, tp), mesh_dim_names=DIMS))
    return _CACHE[key]


def as_mesh(mesh: Mesh | DeviceMesh | None, default_dim: str) -> Mesh:
    """A Mesh from a Mesh, a DeviceMesh with dimensions named "ep" and/or "tp", or None (every rank
    along ``default_dim``)."""
    if isinstance(mesh, Mesh):
        return mesh
    if mesh is None:
        _require_distributed("a parallel layer")
        return parallel_mesh(**{default_dim: dist.get_world_size()})
    if isinstance(mesh, DeviceMesh):
        names = mesh.mesh_dim_names or ()
        if not names or any(n not in DIMS for n in names):
            raise ValueError(f"a DeviceMesh for shufflemoe must name its dimensions from {DIMS}, "
                             f"got {names}")
        key = (tuple(mesh.mesh.flatten().tolist()), tuple(mesh.mesh.shape), names)
        if key not in _CACHE:
            _CACHE[key] = _build(mesh)
        return _CACHE[key]
    raise TypeError(f"mesh must be a shufflemoe Mesh, a DeviceMesh or None, got {type(mesh).__name__}")


def _build(dm: DeviceMesh) -> Mesh:
    names = dm.mesh_dim_names
    sizes = {n: dm.mesh.shape[names.index(n)] if n in names else 1 for n in DIMS}
    ranks = dm.mesh.reshape(sizes["ep"], sizes["tp"])  # [ep, tp] global ranks, ep-major
    me = dist.get_rank()
    (ep_rank, tp_rank), = (ranks == me).nonzero().tolist()
    groups = {n: dm.get_group(n) for n in names}
    members = {"ep": [ranks[:, t].tolist() for t in range(sizes["tp"])],
               "tp": [ranks[e].tolist() for e in range(sizes["ep"])],
               "all": [ranks.flatten().tolist()]}
    for n in DIMS:
        if n not in groups:  # a dimension of size 1: this rank alone
            groups[n] = _subgroup(members[n], backend=None)
    groups["all"] = _subgroup(members["all"], backend=None)
    if dist.get_backend() == "gloo":
        cpu = dict(groups)
    else:  # gloo twins of every group, for host-side agreement (no device sync)
        cpu = {n: _subgroup(members[n], backend="gloo") for n in ("ep", "tp", "all")}
    return Mesh(dm, sizes["ep"], sizes["tp"], ep_rank, tp_rank, groups, cpu)


def _subgroup(rank_lists: list[list[int]], backend: str | None) -> dist.ProcessGroup:
    """This rank's group among ``rank_lists`` (collective: every rank creates every group)."""
    if len(rank_lists) == 1 and len(rank_lists[0]) == dist.get_world_size() and backend is None:
        return dist.group.WORLD
    mine, _ = dist.new_subgroups_by_enumeration(rank_lists, backend=backend)
    return mine
