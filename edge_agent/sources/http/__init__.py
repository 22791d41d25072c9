"""Phone and watch apps over HTTP: the source, its request bodies and its server (the
server stack is imported only when a source starts)."""
