"""CPU time of a process and all its descendants, read from /proc (Linux), for benchmarks that measure a server
from outside.

A process's `utime + stime` holds its own threads' time; `cutime + cstime` holds that of the children it has
waited for, which are no longer in /proc. Summed over the live tree, the two never count a second twice, so the
tree's total only grows: the difference of two readings is what the tree spent between them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcStat:
    pid: int
    ppid: int
    ticks: int  # utime + stime + cutime + cstime


def parse_stat(text: str, pid: int) -> ProcStat:
    """One /proc/PID/stat line; fields are counted after the ")" that ends the command name (it may hold spaces)."""
    fields = text.rsplit(")", 1)[1].split()
    # proc(5): field 4 is ppid, 14-17 utime, stime, cutime, cstime; fields[0] here is field 3.
    return ProcStat(pid, int(fields[1]), sum(int(value) for value in fields[11:15]))


def all_stats(proc: Path = Path("/proc")) -> dict[int, ProcStat]:
    """Every live process's figures (those that end while being read are left out)."""
    found: dict[int, ProcStat] = {}
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            text = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        stat = parse_stat(text, int(entry.name))
        found[stat.pid] = stat
    return found


def tree(root: int, stats: dict[int, ProcStat]) -> list[int]:
    """`root` and every live descendant, root first."""
    children: dict[int, list[int]] = {}
    for stat in stats.values():
        children.setdefault(stat.ppid, []).append(stat.pid)
    out, todo = [], [root] if root in stats else []
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def tree_cpu_seconds(root: int, proc: Path = Path("/proc")) -> float:
    """CPU seconds `root` and its descendants (live, and those waited for) have used so far; 0 when it is gone."""
    stats = all_stats(proc)
    return sum(stats[pid].ticks for pid in tree(root, stats)) / CLOCK_TICKS
