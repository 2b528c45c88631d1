"""Local dispatch: one device holds every expert; nothing moves."""

from __future__ import annotations

from .base import DISPATCHERS, Dispatch


@DISPATCHERS.register("local")
class LocalDispatch(Dispatch):
    name = "local"

    def run(self, experts, x, routing, weights, out, cfg, before_combine=lambda: None):
        experts.forward(x, routing, weights, out, cfg, before_combine)
