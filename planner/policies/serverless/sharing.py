"""When models sharing a slice stop sharing it.

Models sharing a slice split its HBM (``resident_split``): each keeps a
part of its weights and streams the rest over C2C on every pass, and they
take turns. That is worth it while it lets a model run at once that would
otherwise wait; it is not once both are busy for long and one of them could
run elsewhere, or wait a while, at a lower cost than streaming both.

``end_share`` decides, for one shared slice, which resident leaves it and
how, or that the share goes on:

1. GIVE_UP: a resident with nothing in flight while another one has work
   leaves at once (no request moves; its HBM goes to the others, which copy
   more of their weights in). Kept, it would only hold HBM the busy ones
   stream around.
2. For each busy resident c, the time to finish the work in flight on the
   slice if the share goes on (its residents alternate, each step with
   their shared residency)

       continue = sum over residents of steps_left x shared_step_s

   against the same work with c gone, the others running with their
   weights copied back in (``alone_step_s`` once ``top_up_s`` is paid; with
   two or more staying, still shared):

       rest = sum over the others of steps_left x step_s (+ top_up_s)

   - MOVE (a slice free for c: idle, or running only models with nothing in
     flight): c runs there in parallel after its switch,
     ``after = max(rest, move_s + c.steps_left x c.alone_step_s)``;
   - QUEUE_BACK (no such slice): c waits for the place the others leave,
     ``after = rest + move_s + c.steps_left x c.alone_step_s``, allowed only
     when that wait, ``rest + move_s``, is within the least slack of c's
     requests (a bounded wait that keeps their targets); the engine keeps c
     from sharing again for ``wait_bound_s``.

   The best candidate ends the share when ``after < (1 - margin) x
   continue``. The switch cost (``move_s``: KV out and back, weights copied
   in, engine set-up) is paid once; the streaming it saves is paid every
   step (``shared_step_s - alone_step_s``), so the comparison is bytes
   streamed per step times the steps left against the switch.

Steps left count the work in flight only (requests that arrive later are
unknown), which errs towards keeping the share.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

GIVE_UP = "give-up"
MOVE = "move"
QUEUE_BACK = "queue"


@dataclass(frozen=True, slots=True)
class Sharer:
    """One resident of a shared slice, as ``end_share`` sees it."""

    model: str
    in_flight: int
    # Iterations its requests in flight still need (the longest decode plus
    # the prefill chunks left).
    steps_left: int
    # One of its steps as it runs now (its part of the weights resident), s.
    shared_step_s: float
    # The same step with what it keeps alone on the slice resident, s.
    alone_step_s: float
    # Copying the rest of its weights in, were it left alone on the slice, s.
    top_up_s: float
    # Running elsewhere: its requests' KV out and back in, its weights
    # copied into the other slice's HBM, engine set-up, s.
    move_s: float
    # How long its requests can wait and still meet their targets: the
    # least slack of those that still can (inf: none can), s.
    slack_s: float

    def check(self) -> None:
        if self.in_flight < 0 or self.steps_left < 0:
            raise ValueError(f"{self.model}: in_flight and steps_left must be >= 0")
        for name in ("shared_step_s", "alone_step_s", "top_up_s", "move_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{self.model}: {name} must be a finite number >= 0, got {v}")


@dataclass(frozen=True, slots=True)
class ShareEnd:
    """The resident that leaves a shared slice, how, and why."""

    model: str
    action: str
    # QUEUE_BACK: how long it may wait for the place the others leave (it
    # does not share again before); else 0.
    wait_bound_s: float
    # The work in flight finished if the share goes on / once it ends, s.
    continue_s: float
    after_s: float
    reason: str


def _rest_s(others: Sequence[Sharer]) -> float:
    if len(others) == 1:
        (o,) = others
        return o.top_up_s + o.steps_left * o.alone_step_s
    return sum(o.steps_left * o.shared_step_s for o in others)


def end_share(
    sharers: Sequence[Sharer], *, free_slice: bool, margin: float = 0.1
) -> ShareEnd | None:
    """Which resident of one shared slice leaves it, and how; None: the
    share goes on (see the module doc). ``free_slice``: some other slice
    could take a leaving resident at once. Ties go to the resident listed
    last (the latest to join)."""
    if not 0 <= margin < 1:
        raise ValueError(f"margin must be in [0, 1), got {margin}")
    for s in sharers:
        s.check()
    if len(sharers) < 2:
        return None
    busy = [s for s in sharers if s.in_flight > 0]
    idle = [s for s in sharers if s.in_flight == 0]
    if busy and idle:
        leaver = idle[-1]
        return ShareEnd(
            leaver.model,
            GIVE_UP,
            0.0,
            0.0,
            0.0,
            f"{leaver.model} has nothing in flight; "
            f"{', '.join(s.model for s in busy)} get its HBM back",
        )
    if len(busy) < 2:
        return None
    cont = sum(s.steps_left * s.shared_step_s for s in sharers)
    best: ShareEnd | None = None
    for i, c in enumerate(sharers):
        rest = _rest_s([o for k, o in enumerate(sharers) if k != i])
        own = c.move_s + c.steps_left * c.alone_step_s
        if free_slice:
            after, action, bound = max(rest, own), MOVE, 0.0
        elif rest + c.move_s <= c.slack_s:
            after, action, bound = rest + own, QUEUE_BACK, rest
        else:
            continue
        if after < (1 - margin) * cont and (best is None or after <= best.after_s):
            where = "to a free slice" if action == MOVE else f"back to wait at most {bound:.3g} s"
            best = ShareEnd(
                c.model,
                action,
                bound,
                cont,
                after,
                f"{c.model} {where}: the work in flight done in {after:.3g} s "
                f"against {cont:.3g} s sharing (switch {c.move_s:.3g} s)",
            )
    return best
