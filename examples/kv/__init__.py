"""The README's "Generating typed stubs" example: kv.capnp, its generated kv_capnp.py, a
typed server (server.py) and a typed client (client.py)."""
