"""What a run control key tells the operator: applied by the engine in this process, or sent through the
database and then acknowledged by the engine (its `commands.done_at` set) or not, with the engine's heartbeat.

    await steer(app, "pause", control.pause, "nothing new is leased; requests in flight finish")

In-process the control is the engine itself, so the call has applied it when it returns. Attached, the call
only queues a row (`AttachedControl`): a toast says it was sent, and a worker waits for the engine to take it
(`AttachedControl.acknowledgement`) and toasts what became of it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from app.engine.record.snapshot import RunRecord
from app.tui.db_source import ACK_TIMEOUT_S, AttachedControl, CommandAck

LATE_ACK_S = 30.0  # a live engine that has not taken a command in ACK_TIMEOUT_S is watched this much longer


def plural(n: int, word: str) -> str:
    """`1 request`, `3 requests`."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def pause_now_question(rec: RunRecord) -> str:
    """The pause-now confirmation: how many requests are on the wire (not leased, not waiting) and the bill."""
    in_flight, waiting = (rec.live.in_flight, rec.live.waiting) if rec.live is not None else (0, 0)
    kept = f" ({plural(waiting, 'sample')} waiting to retry or be stored are kept)" if waiting else ""
    return (
        f"Pause now and cancel the {plural(in_flight, 'request')} on the wire?{kept} Their samples "
        "return to pending, but providers may still bill them."
    )


def acknowledgement_text(what: str, effect: str, ack: CommandAck) -> str:
    """One toast: the engine took the command (after how long), or it did not and what its heartbeat says."""
    if ack.taken:
        return f"{what} acknowledged by the engine ({ack.waited_s:.1f} s): {effect}"
    head = f"{what} not acknowledged after {ack.waited_s:.0f} s"
    engine = ack.engine
    if engine is None or engine.state == "never":
        return f"{head}: no engine has run this yet (no heartbeat); it stays queued for the engine that starts it"
    if engine.state == "running":
        return (
            f"{head}, though the engine beat {engine.age_s:.0f} s ago (is its database refusing writes?); still waiting"
        )
    if engine.state == "stopped":
        return f"{head}: the engine exited {engine.age_s:.0f} s ago; it stays queued for the next engine"
    return (
        f"{head} — is the engine running? (last heartbeat {engine.age_s:.0f} s ago); it stays queued for the next "
        f"engine"
    )


async def steer(
    app: Any, what: str, send: Callable[[], Awaitable[None]], effect: str, *, severity: str = "information"
) -> bool:
    """Send one run control through `app.source.control` and say what became of it (toasts): applied
    in-process, or sent, then acknowledged by the engine or not. False when sending failed (said too)."""
    control = app.source.control
    try:
        await send()
    except Exception as exc:  # e.g. the database is locked: say so, keep the monitor up
        app.notify(f"cannot {what}: {exc}", severity="error", timeout=8)
        return False
    if not isinstance(control, AttachedControl) or control.last_command is None:
        app.notify(f"{what} applied by the engine in this process: {effect}", severity=severity)
        return True
    command_id = control.last_command
    app.notify(f"{what} sent to the engine through the database…", timeout=ACK_TIMEOUT_S + 1)
    app.run_worker(
        _follow(app, control, command_id, what, effect, severity),
        name=f"{what} acknowledgement",
        group="run-control-ack",
        exit_on_error=False,
    )
    return True


async def _follow(app: Any, control: AttachedControl, command_id: int, what: str, effect: str, severity: str) -> None:
    ack = await control.acknowledgement(command_id)
    if ack.taken:
        app.notify(acknowledgement_text(what, effect, ack), severity=severity)
        return
    app.notify(acknowledgement_text(what, effect, ack), severity="warning", timeout=12)
    if ack.engine is not None and ack.engine.alive:
        late = await control.acknowledgement(command_id, LATE_ACK_S)
        if late.taken:
            app.notify(
                acknowledgement_text(what, effect, CommandAck(command_id, True, ack.waited_s + late.waited_s)),
                severity=severity,
            )
