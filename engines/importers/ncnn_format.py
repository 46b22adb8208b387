"""Read ncnn model files: parse the text ``.param`` into layers and blobs, and read the ``.bin`` weights.

Weight storage follows ncnn's model loader: a weight tensor that ncnn reads "with a tag" starts with a
4-byte little-endian tag (0 for float32, 0x01306B47 for float16, any other non-zero bytes for a 256-entry
float32 lookup table followed by uint8 indices); biases and PReLU slopes are untagged float32. Half
precision and index data are padded to a multiple of 4 bytes. Every byte of the ``.bin`` must be used.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engines.errors import ModelError

PARAM_MAGIC = 7767517

TAG_FLOAT32 = 0x00000000
TAG_FLOAT16 = 0x01306B47
TAG_INT8 = 0x000D4B38
TAG_FLOAT32_SCALED = 0x0002C056

ParamValue = int | float | tuple[int | float, ...]


@dataclass(frozen=True)
class NcnnLayer:
    """One line of a ``.param`` file."""

    type: str
    name: str
    bottoms: tuple[str, ...]
    tops: tuple[str, ...]
    params: dict[int, ParamValue]
    line: int
    source: str = ".param"

    def where(self) -> str:
        return f"{self.source} line {self.line}, layer {self.name!r} ({self.type})"

    def int_param(self, key: int, default: int) -> int:
        value = self.params.get(key, default)
        if isinstance(value, tuple):
            raise ModelError(f"{self.where()}: param {key} should be a number, got an array")
        if isinstance(value, float):
            if not value.is_integer():
                raise ModelError(f"{self.where()}: param {key} should be an integer, got {value}")
            return int(value)
        return value

    def float_param(self, key: int, default: float) -> float:
        value = self.params.get(key, default)
        if isinstance(value, tuple):
            raise ModelError(f"{self.where()}: param {key} should be a number, got an array")
        return float(value)

    def array_param(self, key: int) -> tuple[float, ...]:
        value = self.params.get(key, ())
        if not isinstance(value, tuple):
            return (float(value),)
        return tuple(float(v) for v in value)


@dataclass(frozen=True)
class NcnnGraph:
    layers: tuple[NcnnLayer, ...]
    blob_count: int


def _parse_number(text: str, where: str) -> int | float:
    try:
        # ncnn reads a value as float when it carries a decimal point or an exponent.
        if any(ch in text for ch in ".eE"):
            return float(text)
        return int(text)
    except ValueError:
        raise ModelError(f"{where}: {text!r} is not a number; the .param file is corrupt") from None


def parse_param(text: str, source: str = ".param") -> NcnnGraph:
    """Parse the text form of an ncnn ``.param`` file."""
    lines = [(i + 1, ln.split()) for i, ln in enumerate(text.splitlines())]
    lines = [(n, toks) for n, toks in lines if toks]
    if not lines or lines[0][1] != [str(PARAM_MAGIC)]:
        raise ModelError(
            f"{source} is not a text ncnn .param file (first line should be {PARAM_MAGIC}); "
            "re-export the model with ncnn's converter"
        )
    if len(lines) < 2 or len(lines[1][1]) != 2:
        raise ModelError(f"{source}: line 2 should hold the layer and blob counts; the file is corrupt")
    layer_count = int(_parse_number(lines[1][1][0], f"{source} line {lines[1][0]}"))
    blob_count = int(_parse_number(lines[1][1][1], f"{source} line {lines[1][0]}"))
    body = lines[2:]
    if len(body) != layer_count:
        raise ModelError(
            f"{source} declares {layer_count} layers but holds {len(body)}; the file is truncated or corrupt"
        )

    layers: list[NcnnLayer] = []
    tops_seen: set[str] = set()
    for lineno, toks in body:
        where = f"{source} line {lineno}"
        if len(toks) < 4:
            raise ModelError(f"{where}: a layer needs type, name, bottom and top counts; the file is corrupt")
        layer_type, layer_name = toks[0], toks[1]
        n_bottom = int(_parse_number(toks[2], where))
        n_top = int(_parse_number(toks[3], where))
        if n_bottom < 0 or n_top < 0 or len(toks) < 4 + n_bottom + n_top:
            raise ModelError(f"{where}: blob lists are shorter than their counts; the file is corrupt")
        bottoms = tuple(toks[4 : 4 + n_bottom])
        tops = tuple(toks[4 + n_bottom : 4 + n_bottom + n_top])
        for top in tops:
            if top in tops_seen:
                raise ModelError(f"{where}: blob {top!r} is produced twice; the file is corrupt")
            tops_seen.add(top)
        params: dict[int, ParamValue] = {}
        for tok in toks[4 + n_bottom + n_top :]:
            key_text, sep, value_text = tok.partition("=")
            if not sep:
                raise ModelError(f"{where}: parameter {tok!r} is not of the form id=value")
            key = int(_parse_number(key_text, where))
            if key <= -23300:
                items = value_text.split(",")
                count = int(_parse_number(items[0], where))
                values = tuple(_parse_number(v, where) for v in items[1:])
                if count != len(values):
                    raise ModelError(f"{where}: array parameter {key} declares {count} values but holds {len(values)}")
                params[-key - 23300] = values
            else:
                params[key] = _parse_number(value_text, where)
        layers.append(NcnnLayer(layer_type, layer_name, bottoms, tops, params, lineno, source))

    if len(tops_seen) != blob_count:
        raise ModelError(
            f"{source} declares {blob_count} blobs but its layers produce {len(tops_seen)}; the file is corrupt"
        )
    return NcnnGraph(tuple(layers), blob_count)


class WeightReader:
    """Reads an ncnn ``.bin`` front to back, the way ncnn's model loader does."""

    def __init__(self, data: bytes, source: str) -> None:
        self._data = data
        self._pos = 0
        self._source = source

    def _take(self, size: int, what: str) -> bytes:
        end = self._pos + size
        if size < 0 or end > len(self._data):
            raise ModelError(
                f"{self._source} ends after {len(self._data)} bytes while reading {what}; "
                "the .bin is truncated or does not belong to this .param"
            )
        chunk = self._data[self._pos : end]
        self._pos = end
        return chunk

    def raw(self, count: int, what: str) -> np.ndarray:
        """Untagged float32 data (biases, slopes)."""
        return np.frombuffer(self._take(4 * count, what), dtype="<f4").astype(np.float32)

    def tagged(self, count: int, what: str) -> np.ndarray:
        """Weight data preceded by a 4-byte storage tag."""
        tag_bytes = self._take(4, what)
        tag = int.from_bytes(tag_bytes, "little")
        if tag == TAG_FLOAT16:
            data = self._take(_align4(2 * count), what)[: 2 * count]
            return np.frombuffer(data, dtype="<f2").astype(np.float32)
        if tag == TAG_INT8:
            raise ModelError(
                f"{self._source}: {what} is stored as int8 quantized data, which this converter does not "
                "handle; use the float16 or float32 export of the model"
            )
        if tag in (TAG_FLOAT32, TAG_FLOAT32_SCALED):
            return np.frombuffer(self._take(4 * count, what), dtype="<f4").astype(np.float32)
        # Any other non-zero tag: a 256-entry float32 table, then one uint8 index per value.
        table = np.frombuffer(self._take(256 * 4, what), dtype="<f4")
        index = np.frombuffer(self._take(_align4(count), what)[:count], dtype=np.uint8)
        return table[index].astype(np.float32)

    def finish(self) -> None:
        left = len(self._data) - self._pos
        if left:
            raise ModelError(
                f"{self._source} has {left} bytes left over after all weights were read; "
                "the .bin does not belong to this .param"
            )


def _align4(n: int) -> int:
    return (n + 3) // 4 * 4
