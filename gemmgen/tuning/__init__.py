"""Searching a spec's space for the fastest correct kernel: the search and its GPU workers (tune.py),
the tuning database (database.py), the strategies (strategies/), the cost model that ranks points
(costmodel.py), evaluation on a Dask cluster (distributed.py) and replays of recorded searches
(replay.py).
"""
