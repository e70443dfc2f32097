"""Backend-agnostic core: config, problems, algorithms, tasks, federation protocol, server, runner, results.

Nothing in this package imports Ray. Import it as ``fedcomp.platform`` (a bare ``platform`` is the
standard library's module).
"""
