"""The formats a worker writes, and the one a group of mixed releases writes (rolling upgrades).

A worker's changelog records (takeover records, confirmations, the keys its owners tag)
and its assignor's userdata follow one numbered format. Every member tells its group
the newest format it writes (``FORMAT``) when it joins; the group's leader hands every
member the oldest of them, the **group format**, with its assignment, and each member
writes the group format until every member speaks a newer one: the way Kafka Streams'
``upgrade.from`` lets a rolling upgrade run old and new members side by side. A member
handed a group format older than it can still write (``OLDEST_FORMAT``) refuses to work
in that group, in one line, rather than write what the others misread.

Formats:

* 0: the release before formats were carried (takeover records of issue 37; no
  confirmations; assignor userdata without a format). A member that sends no format
  speaks 0.
* 1: confirmation records (``P r <token>``, issue 43) beside the takeover records. A
  worker of format 0 reads a confirmation as a record of no owner and deletes it, so a
  format-1 worker writes them even in a group of format 0: what it loses there is only
  what format 1 adds (docs/operations.md, Upgrading).
"""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import SpecmeterError

__all__ = ["FORMAT", "OLDEST_FORMAT", "FormatRefused", "group_format", "refusal"]

#: the newest format this release writes
FORMAT = 1
#: the oldest format this release can still write (a group of an older one is refused)
OLDEST_FORMAT = 0


class FormatRefused(SpecmeterError, RuntimeError):
    """The group's format is older than this release can write: it must not work there."""


def group_format(member_formats: Iterable[int]) -> int:
    """The format a group writes: the oldest any of its members speaks (``FORMAT`` for none)."""
    return min(member_formats, default=FORMAT)


def refusal(group: int, oldest: int = OLDEST_FORMAT) -> FormatRefused | None:
    """Why this release cannot work in a group of format ``group`` (None: it can)."""
    if group >= oldest:
        return None
    return FormatRefused(
        f"the group's members include a release that writes format {group}, older than this release can write "
        f"(format {oldest} to {FORMAT}): not joining it. Upgrade through a release that writes both "
        "(docs/operations.md, Upgrading), or stop the old workers first"
    )
