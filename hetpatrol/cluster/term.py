"""The terminal helpers ``hetpatrol status`` uses (colour on a terminal, control
characters escaped), shared by the cluster views.

They live in :mod:`hetpatrol.status_view` on this branch and in
:mod:`hetpatrol.node_view` once the node-view rework is merged: taken from wherever they
are, so these views colour and escape exactly as ``status`` does.
"""

from __future__ import annotations

try:
    from hetpatrol.node_view import _Painter as Painter  # type: ignore[import-not-found]
    from hetpatrol.node_view import printable, use_color  # type: ignore[import-not-found]
except ImportError:
    from hetpatrol.status_view import _Painter as Painter
    from hetpatrol.status_view import _printable as printable
    from hetpatrol.status_view import use_color

__all__ = ["Painter", "printable", "use_color"]
