"""Dispatchers, chosen by name from DISPATCHERS (see base.py for the contract)."""

from . import ep, local, tp  # noqa: F401  (registration)
from .base import DISPATCHERS, Dispatch
from .ep import AllGatherDispatch, AllToAllDispatch
from .local import LocalDispatch
from .tp import TensorParallelDispatch

__all__ = ["DISPATCHERS", "AllGatherDispatch", "AllToAllDispatch", "Dispatch", "LocalDispatch",
           "TensorParallelDispatch"]
