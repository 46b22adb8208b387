"""`swapcast bench NAME`: every benchmark under one group, each with its own --help; the older top-level
`bench-NAME` spellings and `swapcast bench [OPTIONS]` (the pipeline benchmark) still parse to the same command,
and are left out of the top-level listing."""

import argparse
import subprocess
import sys

import pytest

from app.cli import build_parser, main
from app.commands import bench, bench_batch, bench_server
from app.commands.bench_group import NO_OLD_NAME, legacy_argv

NAMES = [
    "pipeline",
    "batch",
    "server",
    "network",
    "return-loss",
    "soak",
    "egress",
    "encoder",
    "quality",
    "stability",
    "engines",
    "mesh",
    "upload",
    "watermark",
    "content",
]


def help_of(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--help"])
    assert exited.value.code == 0
    return capsys.readouterr().out


def test_the_group_lists_every_benchmark_and_the_top_level_lists_no_old_spelling(
    capsys: pytest.CaptureFixture[str],
) -> None:
    listed = help_of(["bench"], capsys)
    assert listed.startswith("usage: swapcast bench [-h] NAME ...")
    shown = [line.split()[0] for line in listed.splitlines() if line.startswith("    ") and line.split()]
    assert [name for name in shown if name in NAMES] == NAMES
    top = help_of([], capsys)
    assert "bench-" not in top and "{serve," in top and ",bench," in top


@pytest.mark.parametrize("name", NAMES)
def test_each_benchmark_has_its_own_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert help_of(["bench", name], capsys).startswith(f"usage: swapcast bench {name} [-h]")


@pytest.mark.parametrize("name", [n for n in NAMES if n not in NO_OLD_NAME])
def test_an_older_spelling_parses_to_the_same_command(name: str) -> None:
    parser = build_parser()
    new, old = parser.parse_args(["bench", name]), parser.parse_args([f"bench-{name}"])
    assert old.func is new.func
    routing = ("command", "bench_command")  # which name was typed; the options and their defaults are the same
    assert {k: v for k, v in vars(old).items() if k not in routing} == {
        k: v for k, v in vars(new).items() if k not in routing
    }


def test_old_spellings_keep_their_options() -> None:
    parser = build_parser()
    args = parser.parse_args(["bench-server", "--engines", "mesh", "--seconds", "2"])
    assert args.func is bench_server.run and args.engines == ("mesh",) and args.seconds == 2.0
    assert parser.parse_args(["bench-batch", "--max-batch", "3"]).func is bench_batch.run


def test_bench_with_options_and_no_name_is_still_the_pipeline_benchmark() -> None:
    assert legacy_argv(["bench", "--faces", "1"]) == ["bench", "pipeline", "--faces", "1"]
    assert legacy_argv(["-v", "bench"]) == ["-v", "bench", "pipeline"]
    assert legacy_argv(["bench", "--help"]) == ["bench", "--help"]
    assert legacy_argv(["bench", "server", "--seconds", "1"]) == ["bench", "server", "--seconds", "1"]
    assert legacy_argv(["serve", "bench"]) == ["serve", "bench"]
    args = build_parser().parse_args(legacy_argv(["bench", "--faces", "1", "--no-reference"]))
    assert args.func is bench.run and args.faces == (1,) and args.no_reference


def test_an_unknown_benchmark_is_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench", "nope"])
    assert exited.value.code == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("swapcast: error: argument NAME: invalid choice: 'nope'")


def test_the_console_script_lists_the_benchmarks() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "bench", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert all(f"    {name}" in result.stdout for name in NAMES)


def test_every_group_entry_is_a_parser() -> None:
    parser = build_parser()
    group = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["bench"]
    names = next(a for a in group._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert list(names) == NAMES
