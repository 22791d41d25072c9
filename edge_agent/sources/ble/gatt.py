"""What the Bluetooth LE notification parsers share (no I/O).

A notification's value is an ATT attribute value, at most ``MAX_ATTRIBUTE_BYTES``
(512) octets (Bluetooth Core Specification, Vol 3, Part F, 3.2.9).  The ATT_MTU a
connection negotiated bounds it further (a notification carries ATT_MTU - 3
octets), but BlueZ does not tell a client the negotiated MTU (bleak's
``BleakClient.mtu_size`` always says 23 there), so the parsers assume the largest
value any MTU allows: a longer one cannot have come from a conforming device.
"""

from __future__ import annotations

# Longest attribute value (Core Specification Vol 3, Part F, 3.2.9).
MAX_ATTRIBUTE_BYTES = 512


def sig_uuid(short: int) -> str:
    """The 128-bit form of a 16-bit Bluetooth SIG UUID (Base UUID
    00000000-0000-1000-8000-00805F9B34FB), lower case as bleak reports it."""
    return f"0000{short:04x}-0000-1000-8000-00805f9b34fb"


class MalformedNotification(ValueError):
    """A notification that does not follow its characteristic's format.

    ``reason`` is a short fixed word (counted per reason on the device); the message
    never contains the notification's bytes."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
