"""The spec language: spec text in, typed Specs out, every mistake a SpecError at its line and column.

grammar.lark is the grammar; spec.py parses it and holds what a Spec is; errors.py words the errors;
textfile.py and shapes.py read the files a spec names. Nothing here does tiling arithmetic: whether
a spec's values can work together is the Plan's question (gemmgen.plan).
"""
