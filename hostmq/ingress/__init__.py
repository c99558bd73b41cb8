"""The way a message comes in (layer L3): a producer's end of the ingress ring — a session with one
broker, its ring, doorbell and completions (``session``) — used by producers and by the broker's own
scheduler alike. The writer's end is ``broker/writer.py`` over ``shm/ring.py``."""
