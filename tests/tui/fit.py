"""What "nothing is cut" means on a screen, checked on a live Textual screen (the fit tests use it).

A widget is cut when it does not lie inside the screen, or inside its parent's content region along an axis
the parent cannot scroll; when its text needs more rows than it has (and it cannot scroll); when a line of
no-wrap text is wider than it; or when it is displayed with no room at all.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.geometry import Size
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer, Static

from widgets.event_tail import EventTail


def _shown(widget: Widget, screen: Screen) -> bool:
    node = widget
    while node is not None and node is not screen:
        if not node.display or not node.visible:
            return False
        node = node.parent
    return True


def _name(widget: Widget) -> str:
    return f"{type(widget).__name__}#{widget.id}" if widget.id else type(widget).__name__


def _inside(outer, inner, x: bool = True, y: bool = True) -> bool:
    ok_x = outer.x <= inner.x and inner.right <= outer.right
    ok_y = outer.y <= inner.y and inner.bottom <= outer.bottom
    return (ok_x or not x) and (ok_y or not y)


def _scrolls(widget: Widget) -> tuple[bool, bool]:
    """(x, y): whether `widget` shows a scrollbar on that axis (so what is past its edge can be reached)."""
    return widget.show_horizontal_scrollbar, widget.show_vertical_scrollbar


def cuts(screen: Screen) -> list[str]:
    """Every widget of `screen` that is cut, in words (empty when the screen fits)."""
    problems: list[str] = []
    area = screen.region
    for widget in screen.walk_children(with_self=False):
        if not isinstance(widget, Widget) or not _shown(widget, screen):
            continue
        region = widget.region
        if region.area == 0:
            if widget.styles.height is not None and widget.styles.height.is_auto and not widget.size.height:
                continue  # an empty auto-height widget (nothing to show) is not cut
            problems.append(f"{_name(widget)} is displayed with no room ({widget.size})")
            continue
        scrolled = [a for a in widget.ancestors if isinstance(a, Widget) and any(_scrolls(a))]
        if not scrolled and not _inside(area, region):
            problems.append(f"{_name(widget)} {region} is not inside the screen {area}")
        parent = widget.parent
        if isinstance(parent, Widget) and not isinstance(parent, Screen):
            sx, sy = _scrolls(parent)
            if isinstance(parent, Footer):
                sx = sy = False  # a footer key past the edge is a key the operator never sees
            if not _inside(parent.content_region, region, x=not sx, y=not sy):
                problems.append(
                    f"{_name(widget)} {region} is not inside its parent {_name(parent)}'s content "
                    f"{parent.content_region}"
                )
        if isinstance(widget, Static) and not any(_scrolls(widget)):
            problems.extend(_text_cuts(widget))
    return problems


def _text_cuts(widget: Static) -> list[str]:
    size = widget.content_size
    if not size.width or not size.height:
        return []
    out: list[str] = []
    needed = widget.get_content_height(widget.parent.size if widget.parent else size, widget.app.size, size.width)
    if needed > size.height:
        out.append(f"{_name(widget)} needs {needed} rows and has {size.height}")
    content = widget.content
    if isinstance(content, Text) and content.no_wrap and not isinstance(widget, EventTail):
        # EventTail ends a long event message in … by design (one line per event); anything else no-wrap must fit
        for line in content.plain.splitlines():
            if cell_len(line) > size.width:
                out.append(f"{_name(widget)}: {line!r} is {cell_len(line)} cells in {size.width}")
    return out


def blank_rows(screen: Screen) -> int:
    """Rows of the screen with nothing drawn on them (spaces only)."""
    strips = screen._compositor.render_strips()
    return sum(1 for strip in strips if not "".join(seg.text for seg in strip).strip())


def screen_text(screen: Screen) -> list[str]:
    """The screen as text, one string per row."""
    return ["".join(seg.text for seg in strip) for strip in screen._compositor.render_strips()]


__all__ = ["cuts", "blank_rows", "screen_text", "Size"]
