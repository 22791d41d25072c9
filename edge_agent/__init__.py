"""edge-agent: perturbs sensor readings on the device and publishes only private reports.

The package holds the device program and what the collector shares with it, in layers
that import only downwards:

* ``mechanisms``: the local-differential-privacy math (every mechanism, the output grid,
  the range search's arithmetic); no I/O;
* ``protocol``: the messages agents and collectors exchange, typed and bounded, built and
  checked in one place (uses ``mechanisms``);
* ``common``: what both programs run: the MQTT client, the guarded ASGI server, the
  command line's shared parts and the configuration framework;
* ``config``: the agent's configuration (sources, channels, privacy, the agent);
* ``sources``: where raw readings come from (synthetic, files, MQTT, I2C, HTTP, BLE);
* the agent program itself: ``agent`` (sources -> ``channels`` -> ``state`` ->
  ``transport``), ``readings``, ``spending``, ``range_responder``, ``fleet``,
  ``sdnotify`` and ``cli``.

The collector imports ``mechanisms``, ``protocol`` and ``common``; nothing here imports
the collector.
"""
