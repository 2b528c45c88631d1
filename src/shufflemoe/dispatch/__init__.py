"""Dispatchers, chosen by name from DISPATCHERS (see base.py for the contract)."""

from . import local  # noqa: F401  (registration)
from .base import DISPATCHERS, Dispatch
from .local import LocalDispatch

__all__ = ["DISPATCHERS", "Dispatch", "LocalDispatch"]
