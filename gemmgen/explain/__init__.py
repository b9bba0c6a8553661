"""What a kernel will cost before it runs, with no GPU: the static analysis of a Plan and ptxas's report
(analysis.py: occupancy, arithmetic intensity, bank conflicts, coalescing) and the report that
`gemmgen explain` prints from it (report.py).
"""
