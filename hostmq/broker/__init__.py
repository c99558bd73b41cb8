"""The broker: one process running control (``supervisor``, ``service``) plus its children
``writer``, ``dispatcher`` and ``flusher`` (one module each, ``run(runtime, stop)``)."""
