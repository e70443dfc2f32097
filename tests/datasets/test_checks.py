"""datasets.checks.reading: a decoder's error on a bad file becomes one line naming the file; nothing else changes."""

from __future__ import annotations

import pickle

import pytest

from fedcomp.datasets.checks import read_text, reading


def unpickle(path):
    with reading(path, "a pickled dict"), open(path, "rb") as fh:
        return pickle.load(fh)


def test_a_decoders_error_is_one_line_naming_the_file(tmp_path):
    path = tmp_path / "batch"
    path.write_bytes(pickle.dumps({"a": 1})[:5])
    with pytest.raises(ValueError) as raised:
        unpickle(path)
    assert str(raised.value) == f"{path}: cannot be read (UnpicklingError: pickle data was truncated); expected a pickled dict"
    assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_an_empty_file_says_so(tmp_path):
    path = tmp_path / "batch"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match=r"batch: is empty \(0 bytes\); expected a pickled dict$"):
        unpickle(path)


def test_a_long_message_is_cut_to_its_first_sentence_and_the_path_is_not_repeated(tmp_path):
    path = tmp_path / "image.png"
    with pytest.raises(ValueError) as raised, reading(path, "a PNG image"):
        raise OSError(f"cannot identify image file {str(path)!r}. " + "x" * 300 + "\nmore")
    assert str(raised.value) == f"{path}: cannot be read (OSError: cannot identify image file.); expected a PNG image"


def test_missing_files_and_the_loaders_own_lines_pass_unchanged(tmp_path):
    path = tmp_path / "batch"
    with pytest.raises(FileNotFoundError):
        unpickle(path)
    own = ValueError(f"{path} line 3: income 'rich'; allowed: '<=50K', '>50K'")
    with pytest.raises(ValueError) as raised, reading(path):
        raise own
    assert raised.value is own
    with pytest.raises(ZeroDivisionError), reading(path):  # not a decoder's error: a bug shows as one
        _ = 1 / 0


def test_text_that_is_not_utf8_names_the_line_and_column(tmp_path):
    path = tmp_path / "table.csv"
    path.write_bytes(b"a,b\n1,2\n3,caf\xe9\n")
    with pytest.raises(ValueError) as raised:
        read_text(path, "CSV text")
    assert str(raised.value) == f"{path} line 3: not UTF-8 text (byte 0xe9 at column 6); expected CSV text"
    path.write_bytes(b"\xef\xbb\xbfa,b\n")  # a byte-order mark is not text
    assert read_text(path, "CSV text") == "a,b\n"
    path.write_bytes(b"\xef\xbb\xbfab\xe9\n")  # and counts in no column
    with pytest.raises(ValueError, match=r"line 1: not UTF-8 text \(byte 0xe9 at column 3\)"):
        read_text(path, "CSV text")
