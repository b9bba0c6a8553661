"""gemmgen's version, in a module of its own: the stages that stamp it on what they write (outputs,
bench records, the CLI's --version) read it here, not from the package's __init__, which would tie
every stage to the package's entry points in one import circle."""

__version__ = "0.1.0"
