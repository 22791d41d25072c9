"""Wearables over Bluetooth LE: the source (bleak, imported at start) and its
byte-for-byte parsers."""
