"""argparse `type=` helpers: every number and list a command takes is checked here, while the command line is
parsed, so a bad value ends in one `swapcast: error: argument --x: ...` line and exit status 2 before any
work starts."""

import argparse
from collections.abc import Callable
from typing import TypeVar

N = TypeVar("N", int, float)


def _number(kind: type[N], text: str) -> N:
    try:
        return kind(text)
    except ValueError:
        noun = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"expected {noun}, got {text!r}") from None


def _finite(value: float, text: str) -> float:
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_int(text: str) -> int:
    value = _number(int, text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = _number(int, text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def positive_float(text: str) -> float:
    value = _finite(_number(float, text), text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {value:g}")
    return value


def non_negative_float(text: str) -> float:
    value = _finite(_number(float, text), text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value:g}")
    return value


def unit_fraction(text: str) -> float:
    """A number in [0, 1] (blends, weights)."""
    value = _finite(_number(float, text), text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {value:g}")
    return value


def open_fraction(text: str) -> float:
    """A number strictly between 0 and 1 (shares to remove)."""
    value = _finite(_number(float, text), text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (exclusive), got {value:g}")
    return value


def int_between(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = _number(int, text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}, got {value}")
        return value

    parse.__name__ = f"int_between_{low}_{high}"
    return parse


def port(text: str) -> int:
    """A TCP port; 0 picks a free one."""
    return int_between(0, 65535)(text)


def video_size(text: str) -> tuple[int, int]:
    """A picture size `WxH`, each side even (what the video encoders take) and between 16 and 7680."""
    width, sep, height = text.lower().partition("x")
    if not sep or not width.isdigit() or not height.isdigit():
        raise argparse.ArgumentTypeError(f"expected a size WxH, e.g. 1280x720, got {text!r}")
    size = int(width), int(height)
    if not all(16 <= side <= 7680 and side % 2 == 0 for side in size):
        raise argparse.ArgumentTypeError(f"each side must be even and between 16 and 7680, got {text!r}")
    return size


def http_url(text: str) -> str:
    """A server's base URL: http:// or https:// and a host."""
    scheme, sep, rest = text.partition("://")
    if not sep or scheme.lower() not in ("http", "https") or not rest.strip("/"):
        raise argparse.ArgumentTypeError(f"expected a URL such as https://swap.example.com, got {text!r}")
    return text.rstrip("/")


def comma_list(text: str) -> tuple[str, ...]:
    """The items of a comma list, blanks dropped; refusing an empty one is the caller's choice."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def names(text: str) -> tuple[str, ...]:
    """A comma list of names, blanks dropped; at least one."""
    found = comma_list(text)
    if not found:
        raise argparse.ArgumentTypeError(f"expected a comma list of names, got {text!r}")
    return found


def names_from(allowed: tuple[str, ...], noun: str) -> Callable[[str], tuple[str, ...]]:
    """A comma list of names, each one of `allowed`."""

    def parse(text: str) -> tuple[str, ...]:
        found = names(text)
        unknown = [name for name in found if name not in allowed]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {noun} {unknown[0]!r}; choose from {', '.join(allowed)}")
        return found

    parse.__name__ = f"{noun}_names"
    return parse


def one_of(allowed: tuple[str, ...], noun: str, *, upper: bool = False) -> Callable[[str], str]:
    """One of `allowed` (compared in upper case with `upper`)."""

    def parse(text: str) -> str:
        value = text.upper() if upper else text
        if value not in allowed:
            raise argparse.ArgumentTypeError(f"unknown {noun} {text!r}; choose from {', '.join(allowed)}")
        return value

    parse.__name__ = noun
    return parse


def counts(low: int = 1, high: int | None = None) -> Callable[[str], tuple[int, ...]]:
    """A comma list of whole numbers, each between `low` and `high` (no upper bound when None)."""

    def parse(text: str) -> tuple[int, ...]:
        values = []
        for part in names(text):
            try:
                value = int(part)
            except ValueError:
                raise argparse.ArgumentTypeError(
                    f"expected a comma list of numbers, e.g. 1,2,4, got {text!r}"
                ) from None
            if value < low or (high is not None and value > high):
                bound = f"between {low} and {high}" if high is not None else f"at least {low}"
                raise argparse.ArgumentTypeError(f"each value must be {bound}, got {value}")
            values.append(value)
        return tuple(values)

    parse.__name__ = "counts"
    return parse


def fractions(text: str) -> tuple[float, ...]:
    """A comma list of numbers strictly between 0 and 1, e.g. 0.25,0.5,0.75."""
    try:
        return tuple(open_fraction(part) for part in names(text))
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"expected a comma list of fractions, e.g. 0.25,0.5,0.75 ({exc})") from None


def add_hand_clip_options(p: argparse.ArgumentParser) -> None:
    """`--frames` and `--hand-model` of the occlusion measurement (bench-quality, bench-stability)."""
    p.add_argument("--frames", type=int_between(8, 400), default=40, help="frames of the hand-crossing clip")
    p.add_argument(
        "--hand-model",
        choices=("hand_landmark_lite", "hand_landmark"),
        default="hand_landmark_lite",
        help="the occlusion stage's hand model",
    )
