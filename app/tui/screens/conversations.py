"""A run's whole conversations: the list (turn k of T and how each stands, keyset pages from SQLite), and one
conversation's turns, each with its state and verdict; enter on a turn opens its token diff."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rich.cells import cell_len
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer, Static

from app.tui.fetch import Fetched, FetchFailed, fetch_in_thread
from app.tui.format import duration
from app.tui.screens.mismatches import VERDICT_LABELS, run_goes_on
from app.tui.source import ConversationRow, TurnRow, conversation_status
from widgets.page_table import PageTable

if TYPE_CHECKING:
    from textual import getters

    from app.tui.monitor import MonitorApp

PAGE_SIZE = 50
LIVE_REFRESH_S = 2.0  # while the run goes on, the shown page (or turns) is re-read this often (slower when slow)

# how a conversation stands (app.store.rows.CONVERSATION_STATUSES), in the list's words
STATUS_LABELS = {
    "not_started": "not started",
    "ready": "ready",  # its turn `at_turn` is pending: its parent answered, the request is written
    "running": "in flight",  # its turn `at_turn` is leased; the turns after it wait on it
    "done": "✓ done",
    "diverged": "✗ diverged",
    "failed": "✗ failed",
    "truncated": "truncated",
    "skipped": "skipped",
}
# a turn's sample state, in the turn list's words
TURN_STATE_LABELS = {
    "pending": "pending",
    "waiting": "waiting on parent",
    "leased": "in flight",
    "done": "✓ done",
    "failed": "✗ failed",
    "skipped": "skipped",
}
LIST_COLUMNS = (("conversation", 12), ("dataset", 8), ("turn", 11), ("status", 11), ("done", 5), ("note", 4))
TURN_COLUMNS = (("turn", 5), ("sample", 13), ("state", 17), ("verdict", 11), ("tokens", 6), ("note", 14))


def stretch(columns: tuple[tuple[str, int], ...], wide: dict[int, int], room: int) -> tuple[int, ...]:
    """Column widths within `room` cells: each column in `wide` (index -> the width its longest cell needs) grows
    from its minimum towards that need, in index order, while room is left; the others keep their widths."""
    widths = [w for _, w in columns]
    left = room - sum(widths) - len(columns)
    for i, need in sorted(wide.items()):
        grow = max(0, min(need - widths[i], left))
        widths[i] += grow
        left -= grow
    return tuple(widths)


def turn_words(row: ConversationRow) -> str:
    """`turn 2 of 5`: the turn a conversation's status refers to, of its turns."""
    return f"turn {row.at_turn} of {row.turns}"


def list_cells(row: ConversationRow) -> tuple[str, ...]:
    """One conversation as the list shows it."""
    return (
        row.conversation_id,
        row.dataset,
        turn_words(row),
        STATUS_LABELS.get(row.status, row.status),
        f"{row.done_turns}/{row.turns}",
        "off-policy" if row.off_policy else "",
    )


def turn_cells(row: TurnRow) -> tuple[str, ...]:
    """One turn as the turn list shows it: its state, its verdict when it has ids, why it ended when it did not."""
    verdict = VERDICT_LABELS.get(row.category, row.category) if row.category else "-"
    note = row.error_class or ""
    if row.off_policy:
        note = f"off-policy {note}".strip()
    return (
        f"{row.turn}/{row.turns}",
        row.sample_id,
        TURN_STATE_LABELS.get(row.state, row.state),
        verdict,
        "-" if row.n_tokens is None else f"{row.n_tokens:,}",
        note,
    )


def _caption(candidates: tuple[str, ...], room: int) -> str:
    """The longest wording that fits one line of `room` cells."""
    return next((c for c in candidates if cell_len(c) <= room), candidates[-1])


def _age(updated_at: float | None) -> str:
    """How old a shown page is: `4 s`, `2m05s`."""
    if updated_at is None:
        return ""
    age = max(time.monotonic() - updated_at, 0.0)
    return f"{int(age)} s" if age < 60 else duration(age)


class ConversationsScreen(Screen):
    """The run's conversations in ingest order, a page at a time (keyset pages on turn 1's row key: `]` and `[`,
    or moving past an edge); each with the turn its status refers to (`turn k of T`), how it stands, its turns
    done and whether any turn is off-policy. Enter lists its turns. While the run goes on the page is re-read
    every `live_refresh_s` (not before 3x the last read's time more), the cursor kept on its conversation."""

    if TYPE_CHECKING:  # self.app: textual's typing hook (nothing at run time)
        app = getters.app(MonitorApp)

    class PageLoaded(Fetched):
        """(generation, seconds taken, rows) (`result`) arrived."""

    class PageFailed(FetchFailed):
        """The page could not be read."""

    BINDINGS = [
        # priority: before the table's own enter, so the footer and the help show it
        Binding("enter", "open_conversation", "Turns", id="conversations.turns", priority=True),
        Binding("r", "refresh_page", "Refresh", show=False, id="conversations.refresh"),
        Binding("right_square_bracket", "page(1)", "Next page", show=False, id="conversations.next_page"),
        Binding("left_square_bracket", "page(-1)", "Prev page", show=False, id="conversations.previous_page"),
        Binding("escape", "app.pop_screen", "Back", id="conversations.back"),
    ]

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.rows: tuple[ConversationRow, ...] = ()
        self.has_next = False
        self.after_pk = 0  # the page starts after this turn-1 row key
        self._previous: list[int] = []  # the after_pk of each earlier page (the `[` key goes back through them)
        self.page_number = 1
        self.live_refresh_s = LIVE_REFRESH_S
        self._generation = 0
        self._loading = False
        self._cursor_after_load: int | str = 0  # a row number, or the conversation id to keep the cursor on
        self._updated_at: float | None = None
        self._not_before = 0.0
        self._error: str | None = None
        self._footer_keys: tuple[bool, ...] = ()

    def compose(self) -> ComposeResult:
        yield Static(id="conversations-caption")
        yield PageTable(LIST_COLUMNS, id="conversations-table")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.query_one(PageTable).focus()
        self.load()
        self._clock = self.set_interval(1.0, self._tick)

    def on_screen_suspend(self) -> None:
        self._clock.pause()  # a conversation opened from here: no re-reads behind it

    def on_screen_resume(self) -> None:
        self._clock.resume()
        self._tick()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "open_conversation":
            return bool(self.rows)
        if action == "page":
            step = parameters[0] if parameters else 1
            return self.has_next if step == 1 else bool(self._previous)
        return True

    # --- data ------------------------------------------------------------------------------
    def load(self, cursor: int | str = 0) -> None:
        """Read the page after `self.after_pk` off the UI thread; the cursor goes to row `cursor` (or the row of
        that conversation id) once it arrives."""
        self._cursor_after_load = cursor
        self._loading = True
        self._generation += 1
        generation, after, source = self._generation, self.after_pk, self.app.source

        def fetch() -> tuple[int, float, list[ConversationRow]]:
            started = time.monotonic()
            rows = list(source.conversation_page(after, PAGE_SIZE + 1))  # one more: is there a next page?
            return generation, time.monotonic() - started, rows

        self._update_caption()
        fetch_in_thread(self, fetch, self.PageLoaded, self.PageFailed, group="conversation-page", exclusive=True)

    @on(PageLoaded)
    def _page_loaded(self, message: PageLoaded) -> None:
        generation, took, rows = message.result
        if generation != self._generation:
            return  # an older read: a newer one is on its way
        self._loading = False
        self._error = None
        self._updated_at = time.monotonic()
        self._not_before = self._updated_at + 3 * took
        self.show_rows(tuple(rows[:PAGE_SIZE]), len(rows) > PAGE_SIZE)

    @on(PageFailed)
    def _page_failed(self, message: PageFailed) -> None:
        self._loading = False
        self._error = str(message.error)
        self._update_caption()

    def show_rows(self, rows: tuple[ConversationRow, ...], has_next: bool) -> None:
        """Put one page in the table (UI thread)."""
        table = self.query_one(PageTable)
        cursor = self._cursor_after_load
        if isinstance(cursor, str):
            ids = [r.conversation_id for r in rows]
            cursor = ids.index(cursor) if cursor in ids else min(table.cursor_row, max(len(rows) - 1, 0))
        scroll_y = int(table.scroll_offset.y) if isinstance(self._cursor_after_load, str) else 0
        self.rows, self.has_next = rows, has_next
        room = (table.scrollable_content_region.width or self.size.width) - 2
        cells = [list_cells(r) for r in rows]
        wide = {
            i: max([w, *(cell_len(c[i]) for c in cells)]) for i, (_, w) in enumerate(LIST_COLUMNS) if i in (0, 1, 2, 5)
        }
        table.set_widths(stretch(LIST_COLUMNS, wide, room))
        table.show(cells, cursor=cursor, scroll_y=scroll_y)
        self._update_caption()
        keys = (bool(rows), has_next, bool(self._previous))
        if keys != self._footer_keys:
            self._footer_keys = keys
            self.refresh_bindings()

    def _tick(self) -> None:
        """Once a second: re-read the page when it is due (while the run goes on), and say how old it is."""
        now = time.monotonic()
        if (
            not self._loading
            and self._updated_at is not None
            and now - self._updated_at >= self.live_refresh_s
            and now >= self._not_before
            and run_goes_on(self.app)
        ):
            self.load(cursor=self.selected or 0)
        self._update_caption()

    def _update_caption(self) -> None:
        if self._error is not None:
            shown = f"cannot read them: {self._error} · r retries"
            candidates: tuple[str, ...] = (f"conversations · {shown}", "conversations · read failed · r retries")
        else:
            if self._loading and not self.rows:
                where = "loading…"
            elif not self.rows:
                where = "this run has no conversations"
            else:
                first = (self.page_number - 1) * PAGE_SIZE + 1
                where = f"rows {first:,}–{first + len(self.rows) - 1:,}{'' if self.has_next else ' (the last)'}"
            ago = _age(self._updated_at)
            keys = " · [ ] pages" if self.has_next or self._previous else ""
            candidates = (
                f"conversations · {where} · updated {ago} ago · r refresh{keys}"
                if ago
                else f"conversations · {where}{keys}",
                f"conversations · {where} · {ago} ago · r refresh" if ago else f"conversations · {where}",
                f"conversations · {where}",
            )
        caption = self.query_one("#conversations-caption", Static)
        caption.update(_caption(candidates, caption.content_region.width or self.size.width - 2), layout=False)

    @property
    def selected(self) -> str | None:
        """The conversation id under the cursor, or None."""
        if not self.rows:
            return None
        return self.rows[min(self.query_one(PageTable).cursor_row, len(self.rows) - 1)].conversation_id

    # --- actions ---------------------------------------------------------------------------
    @on(PageTable.RowSelected, "#conversations-table")
    def _row_selected(self) -> None:
        self.action_open_conversation()

    @on(PageTable.EdgeReached, "#conversations-table")
    def _edge_reached(self, event: PageTable.EdgeReached) -> None:
        if self.check_action("page", (event.direction,)):
            self.action_page(event.direction)

    def action_open_conversation(self) -> None:
        conversation_id = self.selected
        if conversation_id is not None:
            self.app.open_conversation(conversation_id)

    def action_refresh_page(self) -> None:
        self.load(cursor=self.selected or 0)

    def action_page(self, step: int) -> None:
        if not self.check_action("page", (step,)):
            return
        if step > 0:
            self._previous.append(self.after_pk)
            self.after_pk = self.rows[-1].pk
            self.page_number += 1
            self.load(cursor=0)
        else:
            self.after_pk = self._previous.pop()
            self.page_number -= 1
            self.load(cursor=PAGE_SIZE - 1)


class ConversationScreen(Screen):
    """One conversation's turns in order: each turn's state (waiting on parent, in flight, done…), its verdict and
    token count when answered, and why it ended when it did not (the highlighted turn's error in full below).
    Enter opens the turn's token diff, `s` its sample detail; re-read while the run goes on."""

    if TYPE_CHECKING:  # self.app: textual's typing hook (nothing at run time)
        app = getters.app(MonitorApp)

    class TurnsLoaded(Fetched):
        """(generation, seconds taken, turns) (`result`) arrived."""

    class TurnsFailed(FetchFailed):
        """The turns could not be read."""

    BINDINGS = [
        Binding("enter", "open_diff", "Diff", id="conversation.diff", priority=True),
        Binding("s", "open_sample", "Sample", id="conversation.sample"),
        Binding("r", "refresh", "Refresh", show=False, id="conversation.refresh"),
        Binding("escape", "app.pop_screen", "Back", id="conversation.back"),
    ]

    def __init__(self, conversation_id: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.conversation_id = conversation_id
        self.turns: tuple[TurnRow, ...] = ()
        self.live_refresh_s = LIVE_REFRESH_S
        self._generation = 0
        self._loading = False
        self._updated_at: float | None = None
        self._not_before = 0.0
        self._error: str | None = None
        self._footer_keys: bool | None = None

    def compose(self) -> ComposeResult:
        yield Static(f"conversation {self.conversation_id} · loading…", id="conversation-header")
        yield PageTable(TURN_COLUMNS, id="turns-table")
        yield Static("", id="turn-error")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        table = self.query_one(PageTable)
        table.focus()
        self.watch(table, "cursor_row", self._show_error, init=False)
        self.load()
        self._clock = self.set_interval(1.0, self._tick)

    def on_screen_suspend(self) -> None:
        self._clock.pause()

    def on_screen_resume(self) -> None:
        self._clock.resume()
        self._tick()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("open_diff", "open_sample"):
            return bool(self.turns)
        return True

    def load(self) -> None:
        """Read the conversation's turns off the UI thread."""
        self._loading = True
        self._generation += 1
        generation, cid, source = self._generation, self.conversation_id, self.app.source

        def fetch() -> tuple[int, float, list[TurnRow]]:
            started = time.monotonic()
            turns = list(source.conversation_turns(cid))
            return generation, time.monotonic() - started, turns

        fetch_in_thread(self, fetch, self.TurnsLoaded, self.TurnsFailed, group="conversation-turns", exclusive=True)

    @on(TurnsLoaded)
    def _turns_loaded(self, message: TurnsLoaded) -> None:
        generation, took, turns = message.result
        if generation != self._generation:
            return
        self._loading = False
        self._error = None
        self._updated_at = time.monotonic()
        self._not_before = self._updated_at + 3 * took
        self.show_turns(tuple(turns))

    @on(TurnsFailed)
    def _turns_failed(self, message: TurnsFailed) -> None:
        self._loading = False
        self._error = str(message.error)
        self._show_header()

    def show_turns(self, turns: tuple[TurnRow, ...]) -> None:
        """Put the turns in the table (UI thread), the cursor kept on its turn."""
        table = self.query_one(PageTable)
        cursor, scroll_y = table.cursor_row, int(table.scroll_offset.y)
        first_load = not self.turns
        self.turns = turns
        if first_load:
            # the cursor starts on the turn the conversation's status refers to (e.g. where it diverged)
            _, at = conversation_status([(t.turn, t.state, t.error_class) for t in turns])
            cursor = next((i for i, t in enumerate(turns) if t.turn == at), 0)
            scroll_y = 0
        room = (table.scrollable_content_region.width or self.size.width) - 2
        cells = [turn_cells(t) for t in turns]
        wide = {i: max([w, *(cell_len(c[i]) for c in cells)]) for i, (_, w) in enumerate(TURN_COLUMNS) if i in (1, 5)}
        table.set_widths(stretch(TURN_COLUMNS, wide, room))
        table.show(cells, cursor=cursor, scroll_y=scroll_y)
        self._show_header()
        self._show_error()
        if bool(turns) != self._footer_keys:
            self._footer_keys = bool(turns)
            self.refresh_bindings()

    def _show_header(self) -> None:
        header = self.query_one("#conversation-header", Static)
        room = header.content_region.width or self.size.width - 2
        if self._error is not None:
            header.update(
                Text(f"conversation {self.conversation_id}: cannot read its turns: {self._error}", style="bold red")
            )
            return
        if not self.turns:
            header.update(
                f"conversation {self.conversation_id}: this run has no such conversation"
                if not self._loading
                else f"conversation {self.conversation_id} · loading…"
            )
            return
        status, at = conversation_status([(t.turn, t.state, t.error_class) for t in self.turns])
        words = STATUS_LABELS.get(status, status)
        done = sum(1 for t in self.turns if t.state == "done")
        total = self.turns[0].turns
        off = sum(1 for t in self.turns if t.off_policy)
        off_words = f" · {off} off-policy" if off else ""
        ago = _age(self._updated_at)
        candidates = (
            f"conversation {self.conversation_id} · {words} at turn {at} of {total} · {done}/{total} turns done"
            f"{off_words} · updated {ago} ago",
            f"conversation {self.conversation_id} · {words} at turn {at} of {total} · {done}/{total} done{off_words}",
            f"{self.conversation_id} · {words} at turn {at} of {total} · {done}/{total} done{off_words}",
            f"{self.conversation_id} · {words} at turn {at} of {total}",
        )
        header.update(_caption(candidates, room), layout=False)

    def _show_error(self) -> None:
        """The highlighted turn's last error in full (a divergence names the differing call), else nothing."""
        turn = self.selected
        line = self.query_one("#turn-error", Static)
        why = (turn.last_error or "") if turn is not None and turn.state in ("failed", "skipped") else ""
        label = (turn.error_class or turn.state) if turn is not None else ""
        line.update(Text(f"turn {turn.turn}: {label}: {why}" if why and turn is not None else ""))
        line.display = bool(why)

    def _tick(self) -> None:
        now = time.monotonic()
        if (
            not self._loading
            and self._updated_at is not None
            and now - self._updated_at >= self.live_refresh_s
            and now >= self._not_before
            and run_goes_on(self.app)
        ):
            self.load()
        elif self.turns:
            self._show_header()

    @property
    def selected(self) -> TurnRow | None:
        """The turn under the cursor, or None."""
        if not self.turns:
            return None
        return self.turns[min(self.query_one(PageTable).cursor_row, len(self.turns) - 1)]

    @on(PageTable.RowSelected, "#turns-table")
    def _row_selected(self) -> None:
        self.action_open_diff()

    def action_open_diff(self) -> None:
        turn = self.selected
        if turn is not None:
            self.app.open_diff(turn.sample_id)

    def action_open_sample(self) -> None:
        turn = self.selected
        if turn is not None:
            self.app.open_sample(turn.sample_id)

    def action_refresh(self) -> None:
        self.load()
