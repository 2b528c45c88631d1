"""Expert strategies, chosen by name from EXPERTS (see base.py for the contract)."""

from . import blockwise, concat, decode, padded, shuffled, sliced  # noqa: F401  (registration)
from .base import EXPERTS, Experts

__all__ = ["EXPERTS", "Experts"]
