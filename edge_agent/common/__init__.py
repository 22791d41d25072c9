"""What both programs run: the MQTT client, the guarded ASGI server, the parts of the
command line they share, the configuration framework, and giving memory back."""
