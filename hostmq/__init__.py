"""hostmq."""
