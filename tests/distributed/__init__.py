"""Multi-rank tests inside the session: gloo process pools (tests/support/dist_pool.py) against one-device
references."""
