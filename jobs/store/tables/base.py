"""What every table of the farm store shares: the declarative `Base`, the clock its rows are stamped
with (naive UTC) and the state a trial is created in."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy.orm import DeclarativeBase

from kernels.base import TrialStatus

# Trial states are kernels.base.TrialStatus. A finished trial (kernels.base.FINISHED) is never run again
# by `farm sweep resume`; every trial row starts PENDING.
PENDING = TrialStatus.PENDING


def now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


class Base(DeclarativeBase):
    pass
