"""RocketMQ's message semantics both ends share (layer L3, RocketMQ's ``common``): delay levels and
schedule records (``schedule``), retry and dead-letter topics (``retry``), transaction half and op
records (``transaction``) and the system topics (``system_topics``). The broker stores and runs them;
producers and consumers build the same records — neither imports the other for them."""
