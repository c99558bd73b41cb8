"""The page-cache tuning bench suite (``hostmq bench``): sweeps the store's tuning switches over
message sizes, flush modes, producer counts and consumer positions, runs the same workloads against
peers (Redis Streams, pyzmq ipc, multiprocessing.Queue), measures the raw limits of the machine in
the same run, and writes ``results.csv``, ``report.md`` and PNG plots.

* ``scenarios`` — the sweep (pure): which runs, and the store config of each;
* ``workers``   — the processes of a run: producers, consumers, peer servers' clients;
* ``limits``    — raw limits (mmap append bandwidth, fsync latency) and the machine's description;
* ``runner``    — one run of hostmq or a peer, and the sweep that writes the CSV;
* ``report``    — tables and plots from the CSV (matplotlib).
"""
