"""Deploy tests reuse the server fixtures: loopback ICE, a real face clip and photo, the pipeline factory."""

from tests.server.conftest import clip, loopback_ice, pipeline_factory, tom_png

__all__ = ["clip", "loopback_ice", "pipeline_factory", "tom_png"]
