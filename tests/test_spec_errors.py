"""A corpus of broken specs: each one must fail with a SpecError at the right place.

Every entry is (spec text, line, column, part of the message, part of the 'allowed' hint). The
test checks that parsing and planning raise SpecError and nothing else, that the error points
at the expected line and column, that its report quotes that line with a caret under the
column, and that the hint says what would be accepted.
"""

from __future__ import annotations

import re

import pytest

from gemmgen.errors import SpecError
from gemmgen.plan import make_plan
from gemmgen.spec import parse


def parse_and_plan(text: str) -> None:
    """What `gemmgen build` does with a spec before generating code."""
    for spec in parse(text, "t.gemm"):
        make_plan(spec)


def k(*lines: str, name: str = "k", extends: str = "") -> str:
    """A kernel from its setting lines (line 1 is `kernel ...{`, settings start on line 2)."""
    head = f"kernel {name}" + (f" extends {extends}" if extends else "") + " {\n"
    return head + "".join(f"  {line}\n" for line in lines) + "}\n"


# A kernel that plans: 64 x 64 block, 256 threads of 4 x 4.
OK = ("block 64 x 64 x 8", "thread 4 x 4")
# The same with warp tiles: 4 warps of 32 x 32, 4 x 8 lanes of 8 x 4 per thread.
WARPS = ("block 64 x 64 x 8", "warp 32 x 32", "thread 8 x 4")

SETTINGS_HINT = "a setting: target, layout, block"

CORPUS = [
    # --- syntax: braces, lines, tokens --------------------------------------------------
    pytest.param("kernel k {\n  block 64 x 64 x 8\n  thread 4 x 4\n", 3, 15,
                 "closing '}' is missing", "'}' after the last setting", id="missing-closing-brace"),
    pytest.param("kernel k\n  block 64 x 64 x 8\n}\n", 1, 9, "unexpected end of line", "'{'",
                 id="missing-opening-brace"),
    pytest.param("kernel k block 64 x 64 x 8\n}\n", 1, 10, "unexpected 'block'", "extends, '{'",
                 id="setting-on-kernel-line-without-brace"),
    pytest.param(k(*OK) + "}\n", 5, 1, "unexpected '}'", "kernel NAME", id="extra-closing-brace"),
    pytest.param("kernel a {\n  block 32 x 32 x 1\n\nkernel b {\n  block 32 x 32 x 1\n}\n", 4, 1,
                 "missing its closing '}'", "'}' after the last setting",
                 id="kernel-inside-unclosed-kernel"),
    pytest.param(k(*OK) + "block 64 x 64 x 8\n", 5, 1, "a spec holds kernels", "kernel NAME",
                 id="setting-outside-any-kernel"),
    pytest.param("kernel {\n  block 64 x 64 x 8\n}\n", 1, 8, "unexpected '{'", "a name",
                 id="kernel-without-name"),
    pytest.param("kernel 9k {\n  block 64 x 64 x 8\n}\n", 1, 8, "unexpected '9'", "a name",
                 id="kernel-name-starting-with-digit"),
    pytest.param("# only a comment\n", 1, 1, "defines no kernel", "kernel NAME",
                 id="file-without-kernel"),
    pytest.param(k("block 64 x 64 x 8", "blok 4 x 4"), 3, 3, "'blok' is not a setting",
                 SETTINGS_HINT, id="unknown-setting"),
    pytest.param(k("block 64 x 64 x 8", "Block 64 x 64 x 8"), 3, 3, "'Block' is not a setting",
                 SETTINGS_HINT, id="setting-in-wrong-case"),
    pytest.param("kernel k { block 64 x 64 x 8; thread 4 x 4; bogus 3 }\n", 1, 45,
                 "'bogus' is not a setting", SETTINGS_HINT, id="unknown-setting-after-semicolon"),
    pytest.param(k("block 64 x 64", "thread 4 x 4"), 2, 16, "unexpected end of line in 'block'",
                 "block M x N x K", id="block-missing-k"),
    pytest.param(k("block 64 x 64 x 8 x 8"), 2, 21, "unexpected 'x' in 'block'", "block M x N x K",
                 id="block-with-four-sizes"),
    pytest.param(k("block 64 x 64 x -8"), 2, 19, "unexpected character '-'", "block M x N x K",
                 id="negative-number"),
    pytest.param(k("block 64 x 64 x 8 thread 4 x 4"), 2, 21, "unexpected 'thread' in 'block'",
                 "block M x N x K", id="two-settings-on-one-line"),
    pytest.param(k("block 64 x 64 x 8", "thread 4 x"), 3, 13, "unexpected end of line in 'thread'",
                 "thread M x N [repeat M x N]", id="thread-missing-n"),
    pytest.param(k("block 64 x 64 x 8", "thread 4 x 4 repeat"), 3, 22,
                 "unexpected end of line in 'thread'", "repeat M x N", id="repeat-without-sizes"),
    pytest.param(k("block 64 x 64 x 8", "warp 32 32"), 3, 11, "unexpected '32' in 'warp'",
                 "warp M x N", id="warp-missing-x"),
    pytest.param(k("block 64 x 64 x 8", "layout A row B col"), 3, 16, "unexpected 'B' in 'layout'",
                 "layout A row|col, B row|col", id="layout-missing-comma"),
    pytest.param(k("block 64 x 64 x 8", "load D vector 4"), 3, 8, "unexpected 'D' in 'load'",
                 "load A|B", id="load-unknown-operand"),
    pytest.param(k("block 64 x 64 x 8", "shared A"), 3, 11, "unexpected end of line in 'shared'",
                 "plain | pad N | swizzle xor", id="shared-without-mode"),
    pytest.param(k("block 64 x 64 x 8", "stages 2 sync sync"), 3, 17, "unexpected 'sync' in 'stages'",
                 "stages N [sync|async|tma]", id="stages-fill-twice"),
    pytest.param(k("block 64 x 64 x 8", "thread {} x 4"), 3, 11, "unexpected '}'", "a number",
                 id="empty-set"),
    pytest.param(k("block 64 x 64 x 8", "thread é x 4"), 3, 10, "unexpected character 'é'",
                 "thread M x N", id="non-ascii-character"),
    pytest.param("kernel k {\r  block 64 x 64 x 8\n}\n", 1, 11, "control character '\\r'",
                 "lines ending in \\n or \\r\\n", id="lone-carriage-return"),
    pytest.param("# form\x0cfeed\n" + k("block 64 x 64 x 8", "bogus 1"), 4, 3,
                 "'bogus' is not a setting", SETTINGS_HINT, id="form-feed-in-comment-keeps-lines"),

    # --- values the language does not allow ------------------------------------------
    pytest.param(k("target sm_75", *OK), 2, 10, "'sm_75' is not a valid value for target",
                 "sm_80, sm_86, sm_89, sm_90", id="unknown-target"),
    pytest.param(k("block 0 x 64 x 8"), 2, 9, "0 is not a valid value for block.m",
                 "a positive integer", id="zero-block"),
    pytest.param(k("block 64 x 64 x 8", "thread 4 x 4 repeat 1 x x"), 3, 27,
                 "'x' is not a valid value for repeat.n", "a positive integer",
                 id="word-where-a-number-goes"),
    pytest.param(k("block 2147483648 x 64 x 8"), 2, 9, "too large", "a number up to 2147483647",
                 id="number-above-int32"),
    pytest.param(k("block " + "9" * 5000 + " x 64 x 8"), 2, 9, "(5000 digits) is too large",
                 "a number up to", id="number-of-5000-digits"),
    pytest.param(k(*OK, "order z"), 4, 9, "'z' is not a valid value for order", "m (consecutive",
                 id="unknown-order"),
    pytest.param(k(*OK, "load A vector 3"), 4, 17, "3 is not a valid value for load.A.vector",
                 "1, 2 or 4", id="vector-width-3"),
    pytest.param(k(*OK, "load A transpose maybe"), 4, 20, "'maybe' is not a valid value",
                 "on or off", id="transpose-maybe"),
    pytest.param(k(*OK, "load A transpose 1"), 4, 20, "1 is not a valid value for load.A.transpose",
                 "on or off", id="transpose-1-is-not-on"),
    pytest.param(k(*OK, "load C vector 4"), 4, 8, "C is not loaded", "load A or load B",
                 id="load-c"),
    pytest.param(k(*OK, "shared C pad 4"), 4, 10, "C has no shared-memory tile", "shared A, shared B",
                 id="shared-c"),
    pytest.param(k(*OK, "shared A pad 33"), 4, 16, "33 is not a valid value for shared.A.pad",
                 "0 to 32", id="pad-too-large"),
    pytest.param(k(*OK, "shared A swizzle and"), 4, 20, "unknown swizzle 'and'", "swizzle xor",
                 id="unknown-swizzle"),
    pytest.param(k(*OK, "stages 9"), 4, 10, "9 is not a valid value for stages", "1 to 8",
                 id="stages-9"),
    pytest.param(k(*OK, "stages async"), 4, 10, "'async' is not a valid value for stages",
                 "1 to 8", id="stages-without-count"),
    pytest.param(k(*OK, "fragments 3"), 4, 13, "3 is not a valid value for fragments", "1 or 2",
                 id="fragments-3"),
    pytest.param(k(*OK, "raster group 65"), 4, 16, "65 is not a valid value for raster.group",
                 "group N with N from 1 to 64", id="raster-group-65"),
    pytest.param(k(*OK, "raster row 8"), 4, 10, "raster takes 'row' or 'group N'",
                 "raster row | group N", id="raster-row-with-count"),
    pytest.param(k(*OK, "raster group"), 4, 10, "raster takes 'row' or 'group N'",
                 "raster row | group N", id="raster-group-without-count"),
    pytest.param(k(*OK, "epilogue beta"), 4, 12, "unknown epilogue 'beta'", "alpha beta | alpha",
                 id="unknown-epilogue"),
    pytest.param(k(*OK, "reduce max 2"), 4, 10, "unknown reduction 'max'", "reduce min N",
                 id="unknown-reduction"),
    pytest.param(k(*OK, "reduce min 9"), 4, 14, "9 is not a valid value for reduce.count",
                 "min N with N from 1 to 8", id="reduce-count-9"),
    pytest.param(k(*OK, "occupancy 33"), 4, 13, "33 is not a valid value for occupancy",
                 "0 (compiler's choice) to 32", id="occupancy-33"),
    pytest.param(k(*OK, "layout A diag"), 4, 12, "'diag' is not a valid value for layout.A",
                 "row or col", id="unknown-layout"),
    pytest.param(k("block {64, 64} x 64 x 8"), 2, 9, "a set lists a value twice", "distinct values",
                 id="set-with-repeated-value"),

    # --- settings given twice -------------------------------------------------------------
    pytest.param(k("block 64 x 64 x 8", "block 64 x 64 x 8"), 3, 3,
                 "'block' sets block.m again (first set at line 2)", "each setting once per kernel",
                 id="duplicate-block"),
    pytest.param(k(*OK, "load A vector 4", "load A transpose"), 5, 3, "sets load.A.vector again",
                 "each setting once per kernel", id="duplicate-load-line"),
    pytest.param(k(*OK, "shared off", "shared off"), 5, 3, "sets shared again",
                 "each setting once per kernel", id="duplicate-shared-off"),
    pytest.param(k(*OK, "layout A row, A col"), 4, 17, "layout of A given twice", "each of A, B, C",
                 id="layout-operand-twice-on-a-line"),
    pytest.param(k(*OK, "load A vector 4 vector 2"), 4, 26, "'vector' given twice for load A",
                 "load A|B", id="vector-twice-on-a-line"),
    pytest.param(k(*OK) + k(*OK), 5, 8, "kernel 'k' is defined twice", "one kernel per name",
                 id="kernel-defined-twice"),

    # --- extends ----------------------------------------------------------------------------
    pytest.param(k(*OK, extends="nope"), 1, 18, "kernel extends 'nope', which is neither",
                 "NAME.gemm file next to it", id="extends-unknown-kernel"),
    pytest.param(k(*OK, extends="k"), 1, 18, "kernel 'k' extends itself through k",
                 "a chain without loops", id="extends-itself"),
    pytest.param(k(*OK, name="a", extends="b") + k(name="b", extends="a"), 5, 18,
                 "extends itself through a -> b", "a chain without loops", id="extends-cycle"),
    pytest.param(k(*OK, name="a", extends="b") + k(name="b", extends="c") + k(name="c", extends="a"),
                 7, 18, "extends itself through a -> b -> c", "a chain without loops",
                 id="extends-three-kernel-cycle"),
    pytest.param("kernel k extends {\n  block 64 x 64 x 8\n}\n", 1, 18, "unexpected '{'", "a name",
                 id="extends-without-name"),
    pytest.param("kernel k extends a extends b {\n  block 64 x 64 x 8\n}\n", 1, 20,
                 "unexpected 'extends'", "'{'", id="extends-twice"),

    # --- impossible tilings, rejected by the Plan -----------------------------------------
    pytest.param(k("thread 4 x 4"), 1, 8, "has no block setting", "block M x N x K",
                 id="missing-block"),
    pytest.param(k(*OK, name="child", extends="base") + k("thread 4 x 4", name="base"), 5, 8,
                 "kernel 'base' has no block setting", "block M x N x K",
                 id="missing-block-in-parent"),
    pytest.param(k("block {64, 128} x 64 x 8", "thread 4 x 4"), 2, 9, "this spec is a search space",
                 "gemmgen tune", id="search-set-given-to-make-plan"),
    # --- tensor cores: the MMA instruction replaces the thread tile --------------------------
    pytest.param(k(*OK, "math tf32"), 3, 10, "the MMA instruction takes the place of the thread tile",
                 "no thread line", id="tf32-with-thread-tile"),
    pytest.param(k("block 64 x 64 x 8", "math tf32"), 3, 8, "the spec needs a warp tile",
                 "warp M x N", id="tf32-without-warp-tile"),
    pytest.param(k("block 96 x 64 x 8", "warp 24 x 32", "math tf32"), 3, 8,
                 "the warp tile 24 x 32 is not a whole number of 16 x 8 MMA tiles",
                 "warp M a multiple of 16 and N a multiple of 8", id="tf32-warp-not-mma-multiple"),
    pytest.param(k("block 64 x 64 x 12", "warp 32 x 32", "math 3xtf32"), 2, 19,
                 "block K = 12 is not a whole number of the MMA's K steps of 8", "block K a multiple of 8",
                 id="3xtf32-block-k"),
    pytest.param(k("block 64 x 64 x 8", "warp 32 x 32", "math tf32", "mma 16 x 16 x 8"), 5, 7,
                 "mma.sync on sm_90 multiplies TF32 in tiles of 16 x 8 x 8", "target sm_90a",
                 id="tf32-mma-shape"),
    pytest.param(k(*OK, "mma 16 x 8 x 8"), 4, 7, "math simt multiplies with FP32 FFMA",
                 "math tf32 or math 3xtf32", id="mma-without-tensor-math"),
    pytest.param(k("block 64 x 64 x 8", "warp 32 x 32", "math tf32", "fragments 2"), 5, 13,
                 "double-buffered fragments are a simt technique", "fragments 1", id="tf32-fragments"),
    pytest.param(k("block 64 x 64 x 8", "warp 32 x 32", "math tf32", "order m"), 5, 9,
                 "no thread order to choose", "no order line", id="tf32-order"),
    pytest.param(k("block 64 x 64 x 8", "warp 32 x 32", "math 3xtf32", "shared off"), 5, 3,
                 "fragments are read from shared-memory tiles", "shared memory on", id="tf32-shared-off"),
    # --- wgmma (target sm_90a): TMA tiles, K-major operands, warpgroup tiles -----------------
    pytest.param(k("target sm_90a", "layout A col, B col", "block 128 x 128 x 32", "math tf32", "stages 4 tma"),
                 3, 12, "A must be row-major and B column-major", "layout A row, B col; or stages N async",
                 id="wgmma-layout"),
    pytest.param(k("target sm_90a", "layout B col", "block 128 x 128 x 16", "math tf32", "stages 4 tma"),
                 4, 21, "one 128-byte swizzled row of 32 floats", "block M x N x 32", id="wgmma-block-k"),
    pytest.param(k("target sm_90a", "layout B col", "block 192 x 128 x 32", "math tf32", "stages 4 tma"),
                 4, 9, "must be 64 or 128 (one or two consumer warpgroups)", "block 64 or 128", id="wgmma-block-m"),
    pytest.param(k("target sm_90a", "layout B col", "block 128 x 260 x 32", "math tf32", "stages 4 tma"),
                 4, 15, "N a multiple of 8 up to 256", "block N from 8 to 256", id="wgmma-block-n"),
    pytest.param(k("target sm_90a", "layout B col", "block 128 x 256 x 32", "math tf32", "mma 64 x 128 x 8",
                   "stages 4 tma"), 6, 7, "each warpgroup issues wgmma 64 x 256 x 8", "mma 64 x 256 x 8",
                 id="wgmma-mma-shape"),
    pytest.param(k("target sm_90a", "layout B col", "block 128 x 256 x 32", "math tf32", "load A vector 4",
                   "stages 4 tma"), 6, 17, "tiles land in shared memory K-major", "no load or shared lines", id="wgmma-load-line"),
    pytest.param(k("target sm_90a", "layout B col", "block 128 x 256 x 32", "math 3xtf32", "reduce min 2",
                   "stages 3 tma"), 6, 14, "the wgmma path has no fused reduction", "target sm_90 (mma.sync)",
                 id="wgmma-reduce"),
    pytest.param(k("target sm_90a", "layout B col", "block 128 x 256 x 32", "math tf32", "stages 1 tma"), 6, 10,
                 "needs at least 2 buffers", "stages 2 to 8", id="wgmma-one-stage"),
    pytest.param(k("target sm_90a", "layout B col", "block 128 x 256 x 32", "math tf32", "stages 4"), 6, 3,
                 "filled by TMA (a producer warpgroup, K-major A and B) or by cp.async",
                 "stages N tma, or stages N async", id="wgmma-fill-missing"),
    pytest.param(k("block 64 x 64 x 32", "warp 32 x 32", "math tf32", "stages 3 tma"), 5, 12,
                 "TMA copies feed wgmma kernels: target sm_90a", "target sm_90a and tensor-core math",
                 id="tma-without-sm90a"),
    pytest.param(k("target sm_90a", "layout B col", "block 128 x 256 x 32", "math tf32", "stages 6 tma"), 6, 10,
                 "need 296032 bytes of shared memory", "stages 4 or fewer", id="wgmma-too-many-stages"),
    pytest.param(k("target sm_90a", "layout B col", "block 128 x 256 x 32", "math 3xtf32", "stages 2 tma"), 4, 15,
                 "it can have 232", "a smaller block N", id="wgmma-3xtf32-registers"),
    pytest.param(k("block 64 x 64 x 8", "warp 32 x 32", "math 4xtf32"), 4, 9,
                 "unexpected", "math simt | tf32 | 3xtf32", id="math-unknown-word"),
    pytest.param(k("block 64 x 64 x 8", "warp 48 x 32", "thread 4 x 4"), 3, 8,
                 "not a whole number of 48 x 32 warp tiles", "a warp tile that divides 64 x 64",
                 id="warp-tile-not-dividing-block"),
    pytest.param(k("block 64 x 64 x 8", "warp 32 x 32", "thread 3 x 4"), 4, 10,
                 "thread tiles of 3 x 4 do not cover the 32 x 32 sub-tile",
                 "a thread tile that divides 32 x 32", id="thread-tile-not-covering-sub-tile"),
    pytest.param(k("block 64 x 64 x 8", "thread 3 x 4"), 3, 10,
                 "thread tiles of 3 x 4 do not cover the 64 x 64 sub-tile", "divides 64 x 64",
                 id="thread-tile-not-covering-block"),
    pytest.param(k("block 64 x 64 x 8", "warp 32 x 32", "thread 4 x 8 repeat 3 x 1"), 4, 23,
                 "repeat 3 x 1 does not split the warp tile 32 x 32", "a repeat that divides",
                 id="repeat-not-dividing-warp"),
    pytest.param(k("block 64 x 64 x 8", "warp 32 x 32", "thread 4 x 4"), 4, 10,
                 "a warp has 32 threads, but 32 x 32 sub-tiles of 4 x 4 per thread need 64",
                 "32-thread grid", id="warp-not-32-lanes"),
    pytest.param(k("block 64 x 64 x 8", "thread 1 x 2"), 3, 10, "needs 2048 threads per block",
                 "a larger thread tile", id="more-than-1024-threads"),
    pytest.param(k("block 64 x 64 x 8"), 2, 9, "needs 4096 threads per block",
                 "a larger thread tile", id="more-than-1024-threads-default-thread-tile"),
    pytest.param(k("block 24 x 1 x 8", "thread 1 x 1"), 3, 10, "blocks of 24 threads",
                 "a multiple of 32", id="threads-not-multiple-of-32"),
    pytest.param(k("block 64 x 64 x 2", "thread 4 x 4", "load A vector 4"), 4, 17,
                 "rows of 2 floats cannot be read 4 floats at a time", "a vector width that divides 2",
                 id="vector-not-dividing-tile-rows"),
    pytest.param(k("block 64 x 64 x 8", "thread 4 x 4", "layout A col", "load A vector 4"), 5, 17,
                 "A's 8 x 64 tile is 128 loads of 4 float(s), which 256 threads cannot share",
                 "a tile of a multiple of 1024 floats", id="loads-not-divisible-across-threads"),
    pytest.param(k("block 64 x 64 x 8", "thread 2 x 2"), 2, 9,
                 "A's 64 x 8 tile is 512 loads of 1 float(s), which 1024 threads cannot share",
                 "a tile of a multiple of 1024 floats", id="scalar-loads-not-divisible-across-threads"),
    pytest.param(k("block 64 x 64 x 8", "thread 2 x 2", "load A transpose"), 2, 9,
                 "512 loads of 1 float(s), which 1024 threads cannot share", "a tile of a multiple",
                 id="scalar-loads-not-divisible-points-at-block-not-load-line"),
    pytest.param(k("block 64 x 64 x 16", "thread 4 x 4", "load B vector 4", "shared B pad 2"), 5, 3,
                 "pad 2 makes sB rows 66 floats long", "a pad that is a multiple of 4",
                 id="pad-misaligning-vector-stores"),
    pytest.param(k("block 64 x 64 x 12", "thread 4 x 4", "shared A swizzle xor"), 4, 3,
                 "sA rows hold 12 floats (k), which is not a power-of-two", "rows of 8, 16, 32",
                 id="swizzle-on-non-power-of-two-rows"),
    pytest.param(k("block 64 x 64 x 4", "thread 4 x 4", "shared A swizzle xor"), 4, 3,
                 "sA rows hold 4 floats", "or pad N", id="swizzle-on-rows-of-one-chunk"),
    pytest.param(k(*OK, "stages 3 sync"), 4, 10, "loads through registers (sync) use 1 or 2 buffers",
                 "stages 2, or stages 3 async", id="stages-3-sync"),
    pytest.param(k(*OK, "stages 1 async"), 4, 10, "needs at least 2 buffers", "stages 2 async or more",
                 id="async-with-stages-1"),
    pytest.param(k("block 64 x 64 x 1", "thread 4 x 4", "fragments 2"), 4, 13,
                 "the block K step is 1", "fragments 1, or block K >= 2", id="fragments-2-with-block-k-1"),
    pytest.param(k("target sm_86", "block 256 x 256 x 32", "thread 16 x 8", "stages 2 sync"), 5, 10,
                 "need 131072 bytes of shared memory; a block on sm_86 gets at most 101376",
                 "fewer stages, or a smaller block tile", id="too-much-shared-memory-for-sm86"),
    pytest.param(k("block 256 x 256 x 64", "thread 16 x 8", "stages 4 async"), 4, 10,
                 "a block on sm_90 gets at most 232448", "fewer stages",
                 id="too-much-shared-memory-for-sm90"),
    pytest.param(k("block 128 x 128 x 8", "thread 16 x 16"), 3, 10,
                 "about 312 values in registers (256 accumulators)", "a smaller thread tile or repeat",
                 id="too-many-registers"),
    pytest.param(k("block 32 x 1 x 256", "stages 2 sync"), 3, 10, "values in registers",
                 "a smaller thread tile or repeat", id="too-many-registers-from-staging"),
    pytest.param(k(*OK, "occupancy 16"), 4, 13, "16 blocks of 256 threads exceed the 2048 threads",
                 "occupancy up to 8", id="occupancy-over-threads-per-sm"),
    pytest.param(k(*OK, "occupancy 8"), 4, 13, "leave 32 registers per thread, but this tiling needs",
                 "a lower occupancy", id="occupancy-over-registers-per-sm"),
    pytest.param(k(*WARPS, "shared off"), 3, 8, "warp tiles share operands through shared memory",
                 "remove the warp line", id="shared-off-with-warp"),
    pytest.param(k(*OK, "shared off", "load A vector 4"), 5, 17,
                 "'load.A.vector' describes the shared-memory path", "shared off with no load",
                 id="shared-off-with-load"),
    pytest.param(k(*OK, "shared off", "stages 2 sync"), 5, 10,
                 "'stages' describes the shared-memory path", "shared off with no load",
                 id="shared-off-with-stages"),
    pytest.param(k(*OK, "shared off", "stages 1 async"), 5, 12, "cp.async fills shared memory",
                 "stages 1", id="shared-off-with-async"),
    pytest.param(k(*OK, "shared off", "shared A pad 4"), 5, 3,
                 "'shared.A' describes the shared-memory path", "shared off with no load",
                 id="shared-off-with-shared-a"),
    pytest.param(k(*OK, "shared off", "fragments 2"), 5, 13,
                 "'fragments' describes the shared-memory path", "shared off with no load",
                 id="shared-off-with-fragments"),
    pytest.param(k(*OK) + k("block 64 x 64 x 8", "warp 16 x 16", "thread 4 x 4", name="j"), 8, 10,
                 "a warp has 32 threads", "32-thread grid", id="second-kernel-of-file-impossible"),
    # --- split K, staged epilogue, uncoalesced loads ---------------------------------------
    pytest.param(k(*OK, "split 0"), 4, 9, "not a valid value for split", "1 to 256", id="split-zero"),
    pytest.param(k(*OK, "split 2", "reduce min 2"), 4, 9, "fused reduction needs each entry of C final",
                 "split 1 with reduce", id="split-with-reduce"),
    pytest.param(k("block 32 x 32 x 1", "thread 1 x 1", "shared off", "split 2"), 5, 9,
                 "'shared off' turns off", "split 1", id="split-without-shared-memory"),
    pytest.param(k("block 32 x 32 x 1", "thread 1 x 1", "shared off", "epilogue alpha beta staged"), 5, 23,
                 "assembles C in shared memory", "shared memory on", id="staged-without-shared-memory"),
    pytest.param(k(*OK, "split 4", "epilogue alpha staged"), 5, 18, "split K adds partial tiles",
                 "split 1 with staged", id="staged-with-split"),
    pytest.param(k(*OK, "epilogue staged alpha"), 4, 12, "unknown epilogue 'staged alpha'",
                 "alpha beta | alpha [staged | direct | {direct, staged}]", id="staged-in-the-wrong-place"),
    pytest.param(k(*OK, "load A vector 1 uncoalesced maybe"), 4, 31, "not a valid value for load.A.uncoalesced",
                 "on or off", id="uncoalesced-with-a-bad-value"),
    # --- via registers: blocks transposed in registers ----------------------------------------
    pytest.param(k(*OK, "load A vector 2 transpose via registers"), 4, 33,
                 "each thread loads 2 floats of A's 64 x 8 tile, 2 at a time; via registers transposes 2 x 2 blocks",
                 "a tile of a multiple of 1024 floats", id="via-registers-with-too-few-loads"),
    pytest.param(k("block 128 x 64 x 16", "thread 8 x 4", "load A vector 2 transpose via registers",
                   "shared A pad 1"), 5, 3, "sA rows are 129 floats long, so the 2-float transposed stores",
                 "a pad that is a multiple of 2", id="via-registers-with-a-misaligning-pad"),
    pytest.param(k("block 128 x 64 x 16", "thread 8 x 4",
                   "load A vector 2 transpose uncoalesced via registers"), 4, 45,
                 "which uncoalesced would undo", "one of uncoalesced and via registers",
                 id="via-registers-uncoalesced"),
    pytest.param(k(*OK, "load B vector 4 via shared"), 4, 23, "'shared' is not a valid value for load.B.via",
                 "copy (the stages' own copies", id="via-with-a-bad-value"),
    pytest.param(k(*OK, "load A via registers via copy"), 4, 28, "'via' given twice for load A",
                 "[via copy|registers]", id="via-given-twice"),
    pytest.param(k(*OK, "target sm_90a", "math tf32", "stages 4 tma", "load A via registers"), 7, 14,
                 "load and shared lines do not apply", "no load or shared lines", id="via-on-wgmma"),
    # --- unroll: the k loop over a shared tile -------------------------------------------------
    pytest.param(k(*OK, "unroll 3"), 4, 10, "unroll 3 does not divide the block K step of 8",
                 "a divisor of 8, e.g. unroll 4", id="unroll-not-dividing-block-k"),
    pytest.param(k(*OK, "fragments 2", "unroll 1"), 5, 10, "an unrolled body of 1 (odd) steps",
                 "an even unroll, or fragments 1", id="unroll-odd-with-double-buffered-fragments"),
    pytest.param(k("block 32 x 32 x 1", "thread 1 x 1", "shared off", "unroll 1"), 5, 10,
                 "'shared off' turns off", "no unroll line", id="unroll-without-shared-memory"),
    pytest.param(k("block 64 x 64 x 8", "warp 32 x 32", "math tf32", "unroll 4"), 5, 10,
                 "the MMA loop over a K tile is always unrolled whole", "no unroll line", id="unroll-with-mma"),
    pytest.param(k(*OK, "unroll 300"), 4, 10, "300 is not a valid value for unroll",
                 "0 (the whole block K)", id="unroll-too-large"),
]


def test_corpus_is_large():
    assert len(CORPUS) >= 45
    ids = [case.id for case in CORPUS]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("text, line, column, message, allowed", CORPUS)
def test_broken_spec_is_reported_where_it_is_wrong(text, line, column, message, allowed):
    with pytest.raises(SpecError) as info:
        parse_and_plan(text)
    err = info.value
    assert type(err) is SpecError
    assert (err.line, err.column) == (line, column), str(err)
    assert err.path == "t.gemm"
    assert message in err.message, str(err)
    assert allowed in err.allowed, str(err)
    assert_quotes_line_with_caret(err, text)


def assert_quotes_line_with_caret(err: SpecError, text: str) -> None:
    report = str(err).split("\n")
    assert report[0].startswith(f"t.gemm:{err.line}:{err.column}: ")
    # The quoted line as the parser counts lines (only '\n' ends one); unprintable characters
    # show as spaces so that the caret stays under its column.
    source = text.split("\n")[err.line - 1].rstrip("\r")
    shown = "".join(ch if ch.isprintable() else " " for ch in source)
    quote = f"{err.line:5d} | {shown}"
    assert quote in report, str(err)
    caret = report[report.index(quote) + 1]
    match = re.fullmatch(r" {6}\| ( *)(\^+)", caret)
    assert match, f"no caret line under the quote:\n{err}"
    assert len(match.group(1)) == err.column - 1
    assert report[-1] == f"  allowed: {err.allowed}"
