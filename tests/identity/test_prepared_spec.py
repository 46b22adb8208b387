"""The layout a stored identity's prepared data must have, for the mesh engine too (it prepares only a face its
landmark model finds, and its prepared data is one record of texture and landmarks)."""

import numpy as np
import pytest

from app.identity.validate import DamagedIdentity, PreparedSpec, check_prepared
from app.pipeline.factory import build_pipeline
from app.pipeline.pipeline import FramePipeline
from app.pipeline.types import Image
from app.settings import PipelineSettings
from engines.store import ModelStore


@pytest.fixture(scope="module")
def mesh_pipeline(store: ModelStore) -> FramePipeline:
    return build_pipeline(PipelineSettings(engine="mesh", threads=1), store)


def test_the_mesh_layout_is_what_it_prepares_and_damage_is_found(
    mesh_pipeline: FramePipeline, astronaut: Image
) -> None:
    spec = PreparedSpec.of_engine(mesh_pipeline.engine)
    data = mesh_pipeline.prepare_source(astronaut).data
    check_prepared(data, spec)  # a real mesh identity is not damaged

    damaged = data.copy()
    damaged["mesh"][0, 0, 0] = np.nan
    with pytest.raises(DamagedIdentity, match="NaN"):
        check_prepared(damaged, spec)
    with pytest.raises(DamagedIdentity, match="the engine prepares"):
        check_prepared(np.zeros((1, 512), np.float32), spec)


def test_the_mouth_mask_keeps_the_inner_engines_layout(store: ModelStore, astronaut: Image) -> None:
    pipeline = build_pipeline(PipelineSettings(engine="mesh", threads=1, mouth_mask=0.5), store)
    check_prepared(pipeline.prepare_source(astronaut).data, PreparedSpec.of_engine(pipeline.engine))
