"""The fault suite: workers on hosts of their own (network namespaces) that
lose the network or are paused mid-work, and what the engine makes of it.

``python -m bench.faults`` (as root: it creates namespaces, veth pairs and a
forwarder) prints one table row per fault; docs/reliability.md has the figures.
"""
