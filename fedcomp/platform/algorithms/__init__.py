"""Built-in algorithms, one module per paper family; :func:`fedcomp.platform.catalog.load_builtins` imports them all,
each registering itself."""
