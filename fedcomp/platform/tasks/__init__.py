"""Built-in tasks, one module each; :func:`fedcomp.platform.catalog.load_builtins` imports them all, each registering
itself with its declaration in :mod:`fedcomp.platform.tasks.builtins`."""
