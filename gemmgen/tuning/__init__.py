"""Searching a spec's space for the fastest correct kernel: the search (tune.py), its runner of
disposable GPU workers on this host (runner.py) and how each candidate is measured (measure.py),
the tuning database (database.py), the strategies (strategies/), the cost model that ranks points
(costmodel.py), evaluation on a Dask cluster (distributed.py) and replays of recorded searches
(replay.py).
"""
