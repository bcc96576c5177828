"""The built-in local web: a synthetic site generator, a real-web mode and a loopback server."""
