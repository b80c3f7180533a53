"""Relocated events spliced into a chunk, and undone, in numpy and regular expressions: the
twins of the C extension's `splice` and `undo_relocations`."""

from __future__ import annotations

import re

import numpy as np

from tracestream._native.reference.keys import skip_whitespace
from tracestream.model import PROVENANCE_MARK

_PID_TO_TID = b', "tid": '
_CLOSE = 0x7D


def splice(data: bytes, columns: tuple, with_args: np.ndarray, new_tids: list, new_pids: list,
           with_args_member: tuple[bytes, ...], no_args_member: tuple[bytes, ...],
           groups: list | None = None, into=None) -> bytes:
    """The chunk with n events spliced in place. `columns` holds seven int64 arrays of
    length n: previous, pid_start, pid_end, tid_start, tid_end, resume (where the
    original bytes go on: inside the args' brace, or at the event's `}`) and ordinal.

    Per event: data[previous:tid_start] (with data[pid_start:pid_end] replaced by
    new_pids[i] unless that is None), new_tids[i], data[tid_end:resume], and the member:
    member[0] + pid + member[1] + tid + member[2] + ordinal + groups[i] + member[3], from
    `with_args_member` where with_args[i] (followed by `, ` unless the args are empty)
    and from `no_args_member` elsewhere; `groups` (per event the lane group's member, bytes
    or None) is None where no event has one. data[resume[-1]:] ends the chunk.

    Assembled from whole columns, without a Python loop over the events. `into` is the C
    extension's (a slot to write into); here the bytes are returned.
    """
    previous, p0, p1, t0, t1, resume, ordinals = columns
    view = np.frombuffer(data, np.uint8)
    with_args = np.asarray(with_args, bool)
    usual, without = _template(with_args_member), _template(no_args_member)
    # the member's end after the ordinal, per event: its group's member, if any, then the end
    # of the template (a `%b` value, so the templates keep one shape)
    tails = [with_args_member[3]] * len(new_tids) if groups is None else [
        (g or b"") + with_args_member[3] for g in groups]
    usual = usual[: usual.rindex(b"%d") + 2] + b"%b"
    piece = data.__getitem__
    p0l, p1l, t0l, t1l = p0.tolist(), p1.tolist(), t0.tolist(), t1.tolist()
    previous_l, resume_l, ordinal_l = previous.tolist(), resume.tolist(), ordinals.tolist()
    # Kineto's `0, "tid": 7` between the pid value and the tid value, the member's own
    # bytes there: one piece of the event for the member
    if with_args_member[1] == _PID_TO_TID and len(p0l) and _all_between(view, p1, t0,
                                                                        _PID_TO_TID):
        pid_to_tid = usual.replace(b"%b" + _PID_TO_TID + b"%b", b"%b") + b", "
        members = list(map(pid_to_tid.__mod__, zip(map(piece, map(slice, p0l, t1l)),
                                                   ordinal_l, tails)))
    else:
        members = list(map((usual + b", ").__mod__, zip(
            map(piece, map(slice, p0l, p1l)), map(piece, map(slice, t0l, t1l)), ordinal_l,
            tails)))
    for k in _other_members(data, view, resume, with_args):
        member = (usual % (data[p0l[k] : p1l[k]], data[t0l[k] : t1l[k]], ordinal_l[k], tails[k])
                  if with_args[k] else
                  without % (data[p0l[k] : p1l[k]], data[t0l[k] : t1l[k]], ordinal_l[k]))
        if not with_args[k] and groups is not None and groups[k]:
            end = len(no_args_member[3])
            member = member[:-end] + groups[k] + member[-end:]
        members[k] = member
    out = [b""] * (4 * len(p0l) + 1)
    out[0:-1:4] = map(piece, map(slice, previous_l, t0l))  # the pid stays...
    for k, new_pid in enumerate(new_pids):
        if new_pid is not None:  # ... unless it moves
            out[4 * k] = b"".join((data[previous_l[k] : p0l[k]], new_pid,
                                   data[p1l[k] : t0l[k]]))
    out[1:-1:4] = new_tids
    out[2:-1:4] = map(piece, map(slice, t1l, resume_l))
    out[3:-1:4] = members
    out[-1] = data[resume_l[-1]:] if resume_l else data
    return b"".join(out)


def _all_between(view: np.ndarray, starts: np.ndarray, ends: np.ndarray, text: bytes) -> bool:
    """Whether every view[starts[i]:ends[i]] is `text`."""
    if not ((ends - starts) == len(text)).all():
        return False
    return all((view[starts + k] == byte).all() for k, byte in enumerate(text))


def _template(parts: tuple[bytes, ...]) -> bytes:
    """A member's parts (around its pid, tid and ordinal) as a `%` template."""
    first, between, before_ordinal, last = (part.replace(b"%", b"%%") for part in parts)
    return first + b"%b" + between + b"%b" + before_ordinal + b"%d" + last


def _other_members(data: bytes, view: np.ndarray, resume: np.ndarray,
                   with_args: np.ndarray) -> list[int]:
    """Events whose member is not the usual one with a trailing comma: no args, or empty."""
    inside = np.flatnonzero(with_args)
    first = skip_whitespace(data, view, resume[inside])
    empty = inside[(first < len(view)) & (view[np.minimum(first, len(view) - 1)] == _CLOSE)]
    return sorted(np.flatnonzero(~with_args).tolist() + empty.tolist())


def _reversed_pattern(member_end: bytes, opener: bytes, *, keep_opener: bool) -> re.Pattern:
    """A relocated event's provenance member, with its pid and tid, in the bytes of a chunk
    reversed: `member_end` is the member's reversed end (from its `had_args` on),
    `opener` the reversed bytes before it (the opening of `args`), kept or not.

    Reversed, the pattern starts with a literal only the member holds (found quickly)
    and reads back from it to the event's tid and pid. Groups: 1 original tid, 2
    original pid, 3 the bytes between the tid value and the member, 4 the lane tid, 5
    the bytes between the pid and tid values, 6 the lane pid, 7 `"pid"` and its colon.
    """
    value = rb'([0-9]+-?|"[^"\\]*")'
    w = rb"[ \t\r\n]*"
    # Kineto's simple members between the tid and the args, reversed: value, key, comma
    between = (w + rb'(?:(?:[0-9.eE+-]+|"[^"\\]*")' + w + rb":" + w
               + rb'"(?:st|rud|tac|eman|pb|s|di)"' + w + rb"," + w + rb")*")
    return re.compile(
        re.escape(member_end) + rb'(?:"[^"\\]*" :"puorg" ,)?'  # a lane group's member
        + rb'[0-9]+ :"xedni_tneve_ecruos" ,' + value + rb' :"dit" ,'
        + value + rb' :"dip"\{ :"' + re.escape(PROVENANCE_MARK[::-1]) + rb'"'
        + (rb"(" + opener + between + rb")" if keep_opener else opener + rb"(" + between + rb")")
        + value + rb"(" + w + rb":" + w + rb'"dit"' + w + rb"," + w + rb")" + value
        + rb"(" + w + rb":" + w + rb'"dip")')


_ARGS_OPENER = rb'\{[ \t\r\n]*:[ \t\r\n]*"sgra"[ \t\r\n]*,'
_MOVED_BACK = tuple((member_end, _reversed_pattern(member_end, opener, keep_opener=keep))
                    for member_end, opener, keep in (
    # the event had args: the member and the `, ` after it, or the member alone (empty args)
    (b' ,}eurt :"sgra_dah" ,', _ARGS_OPENER, True),
    (b'}eurt :"sgra_dah" ,', _ARGS_OPENER, True),
    # it had none: `, "args": {member}` goes
    (b'}}eslaf :"sgra_dah" ,', rb'\{ :"sgra" ,', False),
))
"""(the reversed end of a provenance member, the pattern that undoes its event)"""
_GROUPS = 7


def _moved_back(pattern: re.Pattern, data: bytes) -> tuple[bytes, int]:
    """`pattern.subn(rb"\\3\\1\\5\\2\\7", data)` (the original tid and pid in place of the
    lane's, the member gone), assembled from `split` by slicing, without a call per match."""
    parts = pattern.split(data)
    count = len(parts) // (_GROUPS + 1)
    if not count:
        return data, 0
    out = [b""] * (6 * count + 1)
    out[0::6] = parts[0 :: _GROUPS + 1]
    for slot, group in enumerate((3, 1, 5, 2, 7), 1):
        out[slot::6] = parts[group :: _GROUPS + 1]
    return b"".join(out), count


def undo_relocations(data: bytes) -> tuple[bytes, int] | None:
    """The relocated events in `data` back on their original pid and tid, their provenance
    member gone, and how many; None if any provenance is left.

    Quick, not exact: the pid and tid are not proven top-level members, nor is the source
    index checked. Trusted only through the sha256 its caller compares with the source's
    (restore's; see commands/restore.py). Regular expressions over the chunk's reversed
    bytes: each starts at a literal only the member holds and reads back to the tid and pid.
    """
    key = PROVENANCE_MARK
    if key not in data:
        return data, 0
    back = data[::-1]
    count = 0
    for member_end, pattern in _MOVED_BACK:
        if key[::-1] not in back:
            break
        if member_end not in back:  # a pass over the chunk saved (a quick search)
            continue
        back, undone = _moved_back(pattern, back)
        count += undone
    if key[::-1] in back:
        return None
    return back[::-1], count


