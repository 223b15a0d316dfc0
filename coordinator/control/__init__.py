"""The test control plane: faults, waits, time travel and a request log over HTTP (docs/control.md).

:func:`control_plane_for` gives the Kafka server its request hook: the control plane, or the
no-op :data:`~rallypoint.control.hooks.NO_HOOK` when ``rallypoint.control.port`` is -1.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .hooks import NO_HOOK, RequestHook

if TYPE_CHECKING:
    from ..broker import Broker

OFF = -1


def control_plane_for(broker: Broker) -> RequestHook:
    if broker.config["rallypoint.control.port"] == OFF:
        return NO_HOOK
    from .plane import ControlPlane

    return ControlPlane(broker)


__all__ = ["NO_HOOK", "RequestHook", "control_plane_for"]
