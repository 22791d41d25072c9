"""The collector's MQTT side: the journaling network child (``network``, with
``lifetime`` tying children to their parent) and the publisher (``publisher``)."""
