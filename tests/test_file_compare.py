"""The file-map comparison the run tests use names what differs, and only that."""

from __future__ import annotations

import pytest

from tests.conftest import assert_same_files


def test_equal_maps_pass():
    assert_same_files({"a": b"x", "b/c": b"yz"}, {"b/c": b"yz", "a": b"x"})


def test_a_difference_names_the_file_sizes_and_first_differing_byte():
    with pytest.raises(AssertionError) as err:
        assert_same_files({"a": b"same", "s.pb": b"abcXef"}, {"a": b"same", "s.pb": b"abcdefg"})
    message = str(err.value)
    assert message.splitlines()[0] == "1 file(s) differ:"
    assert "differs: s.pb (6 vs 7 bytes, first at byte 3: b'Xef' vs b'defg')" in message
    assert "a " not in message.replace("differ:", "")


def test_files_on_one_side_only_are_named():
    with pytest.raises(AssertionError) as err:
        assert_same_files({"a": b"1", "new": b"2"}, {"a": b"1", "gone": b"3"})
    assert "only in got: new" in str(err.value) and "only in want: gone" in str(err.value)
