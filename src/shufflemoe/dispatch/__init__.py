"""Dispatchers, chosen by name from DISPATCHERS (see base.py for the contract), and the mesh
they run on."""

from . import ep_allgather, ep_alltoall, local, tp  # noqa: F401  (registration)
from .base import DISPATCHERS, Collective, Dispatch
from .eplb import Placement, balanced
from .ep_allgather import AllGatherDispatch
from .ep_alltoall import AllToAllDispatch
from .local import LocalDispatch
from .mesh import Mesh, parallel_mesh
from .tp import SequenceParallelDispatch, TensorParallelDispatch

__all__ = ["DISPATCHERS", "AllGatherDispatch", "AllToAllDispatch", "Collective", "Dispatch",
           "LocalDispatch", "Mesh", "Placement", "SequenceParallelDispatch",
           "TensorParallelDispatch", "balanced", "parallel_mesh"]
