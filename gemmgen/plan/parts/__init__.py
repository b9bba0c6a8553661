"""A kernel built from parts, as CUTLASS 3 composes a collective mainloop, a collective epilogue and a
tile scheduler: a Tile (block, warp and thread tiles), a Mainloop (how A and B reach the math:
SIMT, mma.sync, wgmma fed by registers, wgmma fed by TMA), an Epilogue (how the accumulators reach
C) and a Schedule (how blocks take the C tiles: data-parallel, split K, persistent, stream-K,
ping-pong, with or without clusters).

Each part owns, for its settings:
- the checks: SpecErrors at the spec line, raised where the planner consults the part;
- its derived numbers (fields and properties);
- its rows: the header comment of the generated .cu and `gemmgen explain` read them;
- its templates: the includes and macro modules the kernel templates take from it, in place of
  `{% if %}` ladders over every path;
- its share of the launch (grid, extra kernels and arguments, workspace), which both the C
  launcher and gemmgen/launch.py render.
The Plan (plan/base.py) holds one of each; make_plan (plan/__init__.py) composes them.
"""
