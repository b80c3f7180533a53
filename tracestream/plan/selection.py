"""Which GPU's matches a spec means: --pid/--device as given (an integer when it looks like
one), and the one process and device that hold matches when none is given."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from tracestream.errors import Option, SpecError
from tracestream.index.matches import MatchTable
from tracestream.index.vocabulary import KernelVocabulary
from tracestream.plan.hints import no_match


def select_gpu(matches, pid: Any, device: Any, what: str, pattern: str,
               vocabulary: KernelVocabulary) -> tuple[Any, Any]:
    """The one (pid, device) the matches are on, or a refusal that lists the candidates
    (`what`: the spec field of the pattern, e.g. `anchor_regex`; a pid or device without
    a match is refused with the closest kernel names of that pid from `vocabulary`)."""
    if not matches and pid is None:  # with a pid, the refusal below names its kernels
        raise no_match(what, pattern, vocabulary)
    gpus = gpu_counts(matches)
    if pid is not None:
        gpus = Counter({key: gpus[key] for key in same_id_filter(gpus, pid, lambda k: k[0])})
        if not gpus:
            raise no_match(what, pattern, vocabulary, same_id_filter(vocabulary.pids(), pid),
                           f" in pid {id_text(pid)}", f"pid {id_text(pid)} has no kernels")
    pids: Counter = Counter()
    for (p, _), n in gpus.items():
        pids[p] += n
    if len(pids) > 1:
        listing = ", ".join(f"pid {id_text(p)}: {n}"
                            for p, n in sorted(pids.items(), key=_order))
        raise SpecError(
            Option(what), f" matches kernels in several processes ({listing}); pick one with ",
            Option("pid"),
        )
    chosen_pid = next(iter(pids))
    if device is not None:
        on_pid = gpus
        gpus = Counter({key: gpus[key] for key in same_id_filter(gpus, device, lambda k: k[1])})
        if not gpus:  # the name is right, the device is not: say where it matches
            raise SpecError("no kernel matches ", Option(what),
                            f" {pattern!r} on device {id_text(device)} of pid "
                            f"{id_text(chosen_pid)}; it matches on {gpu_listing(on_pid)}")
    devices: Counter = Counter()
    for (_, d), n in gpus.items():
        devices[d] += n
    if len(devices) > 1:
        listing = ", ".join(f"device {id_text(d)}: {n}"
                            for d, n in sorted(devices.items(), key=_order))
        raise SpecError(
            Option(what), f" matches kernels on several devices of pid {id_text(chosen_pid)} "
            f"({listing}); "
            "pick one with ", Option("device"),
        )
    return chosen_pid, next(iter(devices))


def gpu_counts(matches) -> Counter:
    """{(pid, device): matches} of a match table (or a list of matches)."""
    return matches.gpus() if isinstance(matches, MatchTable) else Counter(
        (m.pid, m.device) for m in matches)


def gpu_listing(gpus: Counter) -> str:
    """`device 0 of pid 1 (126 matches), ...`: where a pattern matches, for a refusal."""
    return ", ".join(f"device {id_text(d)} of pid {id_text(p)} ({n:,} "
                     f"match{'' if n == 1 else 'es'})"
                     for (p, d), n in sorted(gpus.items(), key=_order))


def _same(value: Any, wanted: Any) -> bool:
    return value == wanted or str(value) == str(wanted)


def same_id_filter(keys, wanted: Any, at=lambda key: key) -> list:
    """The keys whose id (`at(key)`) is `wanted`: exactly (0 is not "0") where one is, else
    as text (`--pid 7` also finds a trace's "7")."""
    exact = [k for k in keys if type(at(k)) is type(wanted) and at(k) == wanted]
    return exact or [k for k in keys if _same(at(k), wanted)]


def id_from_text(value: Any) -> Any:
    """--pid/--device as typed: an integer when it reads as one, else the text; in JSON
    quotes (`--pid '"0"'`) the string inside, for a trace whose pid "0" is a string."""
    if not isinstance(value, str):
        return value
    if len(value) >= 2 and value[0] == value[-1] == '"':
        try:
            inner = json.loads(value)
        except ValueError:
            inner = None
        if isinstance(inner, str):
            return inner
    try:
        return int(value)
    except ValueError:
        return value


def id_text(value: Any) -> str:
    """A pid/device in a message: a string in JSON quotes, so pid "0" is not pid 0."""
    return json.dumps(value) if isinstance(value, str) else str(value)


def _order(item):
    key = item[0]
    return (0, key, "") if isinstance(key, int) else (1, 0, str(key))


def on_gpu(matches, pid: Any, device: Any):
    """Matches on one GPU, sorted by exact start time (ties in file order)."""
    if isinstance(matches, MatchTable):
        return matches.on_gpu(pid, device)
    chosen = [m for m in matches if m.pid == pid and m.device == device]
    chosen.sort(key=lambda m: (m.ts.floor_ns(), m.ts, m.ordinal))
    return chosen
