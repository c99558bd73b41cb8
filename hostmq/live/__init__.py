"""What a running broker publishes and how a broker instance is found (layer L2, below ``broker/`` and
``client/``, which both read it): its state segment (``state``), its role and epoch (``role``), the
instance that plays master of a name (``group``), the role lock a start or a promotion holds
(``role_lock``), and where an instance's files, sockets and segments live (``runtime``). The broker
writes these; clients, the exporter and the CLI read them."""
