"""An ingest stream counts the frames it could not process as dropped, with the reasons sessions use."""

from collections.abc import Callable

import cv2
import httpx
import numpy as np
import pytest

from app.media.clips import load_sample
from app.observability import Metrics
from app.pipeline.factory import build_pipeline
from app.pipeline.pipeline import FramePipeline
from app.pipeline.types import Image
from app.runtime.batcher import BatcherError
from app.server.streams import Stream, StreamOrigin
from app.settings import PipelineSettings
from engines.store import ModelStore
from tests.server.harness import RunningServer


def dropped(metrics: Metrics, reason: str) -> float:
    value = metrics.registry.get_sample_value("swapcast_frames_dropped_total", {"kind": "stream", "reason": reason})
    return value or 0.0


def stream_on(pipeline: FramePipeline, metrics: Metrics) -> Stream:
    source = pipeline.prepare_source(load_sample("tom_hanks"))
    return Stream(StreamOrigin.of("/clip.mp4"), "tom", source, pipeline=pipeline, metrics=metrics)


def test_a_frame_that_fails_is_counted_as_an_error_drop(store: ModelStore, astronaut: Image) -> None:
    pipeline = build_pipeline(PipelineSettings(engine="classic", threads=1), store)
    try:
        metrics = Metrics()
        stream = stream_on(pipeline, metrics)
        assert len(stream.process([astronaut])) == 1
        grey = np.zeros(astronaut.shape[:2], np.uint8)  # no colour channels: the pipeline cannot paste onto it
        with pytest.raises((ValueError, cv2.error)):  # wherever the live path first trips over it
            stream.process([grey])
        assert dropped(metrics, "error") == 1
        assert dropped(metrics, "stale") == 0
        assert metrics.registry.get_sample_value("swapcast_frames_out_total", {"kind": "stream"}) == 1
    finally:
        pipeline.close()


def test_a_frame_the_batcher_refuses_is_counted_as_stale(
    pipeline_factory: Callable[[PipelineSettings], FramePipeline], astronaut: Image
) -> None:
    pipeline = pipeline_factory(PipelineSettings(engine="classic", threads=1))
    metrics = Metrics()
    stream = stream_on(pipeline, metrics)
    pipeline.close()  # its batchers refuse work from now on, as an overloaded one refuses a late frame
    with pytest.raises(BatcherError):
        stream.process([astronaut, astronaut])
    assert dropped(metrics, "stale") == 2
    assert dropped(metrics, "error") == 0


def test_a_stream_refuses_an_unknown_source_transport_and_reports_the_one_it_uses(
    server: RunningServer, store: ModelStore
) -> None:
    refused = httpx.post(
        f"{server.base_url}/v1/streams",
        json={"source_url": "rtsp://127.0.0.1:9/x", "identity": "x", "source_transport": "quic"},
    )
    assert refused.status_code == 422 and "source_transport" in refused.text, refused.text
    pipeline = build_pipeline(PipelineSettings(engine="classic", threads=1), store)
    try:
        source = pipeline.prepare_source(load_sample("tom_hanks"))
        origin = StreamOrigin.of("rtsp://camera/x", transport="udp")
        stream = Stream(origin, "tom", source, pipeline=pipeline, metrics=Metrics())
        assert stream.stats()["source_transport"] == "udp"
        assert (
            Stream(StreamOrigin.of("rtsp://camera/x"), "tom", source, pipeline=pipeline, metrics=Metrics()).stats()[
                "source_transport"
            ]
            == "tcp"
        ), "TCP unless asked: as before"
    finally:
        pipeline.close()
