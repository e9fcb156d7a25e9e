"""The one clock for every timing the suite records: monotonic seconds, never rounded when
stamped. Components take a `Clock` argument so tests can pass a scripted one."""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], float]

monotonic: Clock = time.monotonic
