"""Local dispatch: one device holds every expert; nothing moves."""

from __future__ import annotations

from .base import DISPATCHERS, Dispatch


@DISPATCHERS.register("local")
class LocalDispatch(Dispatch):
    name = "local"

    @classmethod
    def build(cls, layer, mesh=None, **options):
        if options:
            raise ValueError(f"dispatch 'local' takes no options, got {sorted(options)}")
        return layer

    @classmethod
    def layouts(cls, cfg, ep, tp):
        return [{}] if ep == tp == 1 else []

    def run(self, experts, x, routing, weights, out, cfg, before_combine=lambda: None,
            overwrite=False, x_ready=False):
        """overwrite: out = the routed output (the layer asks only strategies that overwrite,
        and says whether x was written before the routing's launches: x_ready, see
        Shuffled.forward)."""
        if overwrite:
            experts.forward(x, routing, weights, out, cfg, before_combine, overwrite=True,
                            x_ready=x_ready)
        else:
            experts.forward(x, routing, weights, out, cfg, before_combine)
