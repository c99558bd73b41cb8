"""The way a message comes in (layer L3): the ingress ring — its geometry and the producer's end
(``ring``), the writer's end (``ring_writer``) —, a producer's session with one broker (``session``,
used by producers and by the broker's own scheduler alike), and the writer's batch protocol as one
bounded step (``step.serve_once``) that the writer process (``broker/writer.py``) loops on."""
