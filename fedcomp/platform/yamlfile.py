"""Reading a user's YAML file (a run config or a sweep file) with one-line errors.

A file that is missing, a folder, unreadable, not UTF-8 text (a binary file named ``.yaml``), not valid
YAML (tab indentation included) or that repeats a key in one mapping fails with a :class:`ConfigError`
naming the file, the line and what is wrong -- never a parser traceback. A leaf module: it imports nothing
of fedcomp but the errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from fedcomp.platform.errors import ConfigError


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error (PyYAML keeps the
    last one silently, so a config could say ``lr: 0.1`` and run with a later ``lr: 10``)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool)) and key is not None:
                raise yaml.constructor.ConstructorError(None, None, f"a key must be a word or a number, not "
                                                        f"a {type(key).__name__}", key_node.start_mark)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is given twice in one mapping",
                                                        key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, where: str) -> Any:
    """Parse ``text`` (from ``where``, named in errors) as YAML with unique keys."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass: as safe as yaml.safe_load
    except yaml.YAMLError as error:
        raise ConfigError(f"{where} is not valid YAML: {_describe(error, text)}") from None


def read_yaml_file(path: str | Path, what: str = "config file") -> Any:
    """The parsed content of the YAML file at ``path``.

    Raises:
        ConfigError: one line naming the file and the problem (missing, a folder, unreadable, not UTF-8
            text, a YAML syntax error with its line and column, a repeated key).
    """
    path = Path(path)
    where = f"{what} {str(path)!r}"
    if path.is_dir():
        raise ConfigError(f"{where} is a folder, not a YAML file")
    if not path.is_file():
        raise ConfigError(f"{where} does not exist")
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ConfigError(f"{where} cannot be read: {error.strerror or error}") from None
    if b"\x00" in data:
        raise ConfigError(f"{where} is a binary file, not YAML text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"{where} is not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start}); save it as UTF-8 YAML"
        ) from None
    return parse_yaml(text, where)


def _describe(error: yaml.YAMLError, text: str) -> str:
    """One line out of PyYAML's multi-line message: where, what, and a hint for tab indentation."""
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    problem = getattr(error, "problem", None) or str(error).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    hint = ""
    if "\t" in problem or (mark is not None and _line(text, mark.line).startswith((" \t", "\t"))):
        hint = " (YAML indents with spaces; this line has a tab)"
    return f"{where}{problem}{hint}".replace("\n", " ")


def _line(text: str, index: int) -> str:
    lines = text.splitlines()
    return lines[index] if 0 <= index < len(lines) else ""


def first_comment(text: str) -> str:
    """A YAML file's one-line description: its first line, where that is a comment (a preset's, a sweep file's)."""
    first = (text.splitlines() or [""])[0]
    return first.lstrip("# ").strip() if first.startswith("#") else ""
