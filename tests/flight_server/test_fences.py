"""The fence board: slots, tags and generations as a same-host reader sees them."""

from __future__ import annotations

import os

import pytest

from trajflight.flight_server.shm._fences import BOARD_FILE, FenceBoard, MappedBoard, read_board


@pytest.fixture
def board(tmp_path):
    b = FenceBoard(str(tmp_path), slots=4)
    yield b
    b.close()


def test_a_reader_matches_only_the_tag_and_generation_it_was_given(board):
    board.install("a", 3)
    reader = MappedBoard(board.path)
    entry = board.entry("a")
    assert entry is not None
    assert read_board(reader, [entry], [3])
    assert not read_board(reader, [entry], [2])  # an older lease
    board.raise_to("a", 4)  # re-granted
    assert not read_board(reader, [entry], [3])
    assert read_board(reader, [entry], [4])
    board.install("a", 4)  # the group changed (an append): a new tag
    assert not read_board(reader, [entry], [4])
    assert read_board(reader, [board.entry("a")], [4])  # type: ignore[list-item]


def test_removed_slots_are_reused_under_new_tags_and_a_full_board_gives_no_slot(board):
    reader = MappedBoard(board.path)
    for key in "abcd":
        board.install(key, 1)
    board.install("e", 1)
    assert board.entry("e") is None  # full: readers of "e" ask the server
    old = board.entry("a")
    assert old is not None
    board.remove("a")
    assert not read_board(reader, [old], [1])
    board.install("e", 1)
    new = board.entry("e")
    assert new is not None
    assert new[0] == old[0]  # the slot is reused...
    assert new[1] != old[1]  # ...the tag never
    assert not read_board(reader, [old], [1])
    assert read_board(reader, [new, board.entry("b")], [1, 1])  # type: ignore[list-item]
    assert not read_board(reader, [], [])
    assert not read_board(reader, [(99, new[1])], [1])  # a slot outside the board


def test_a_replaced_or_closed_board_matches_nothing(tmp_path):
    first = FenceBoard(str(tmp_path), slots=4)
    first.install("a", 1)
    reader = MappedBoard(first.path)
    entry = first.entry("a")
    assert entry is not None
    assert read_board(reader, [entry], [1])
    second = FenceBoard(str(tmp_path), slots=4)  # a restarted server's board (the old file is unlinked)
    assert not reader.current()
    assert not read_board(reader, [entry], [1])
    second.close()
    assert not os.path.exists(os.path.join(str(tmp_path), BOARD_FILE))
    first.close()


@pytest.mark.parametrize("scalar_reads", [0, 64])
def test_the_word_by_word_and_the_vectorised_reads_agree(tmp_path, monkeypatch, scalar_reads):
    """A few reads are checked word by word, many with numpy: both give the same answers."""
    from trajflight.flight_server.shm import _fences

    monkeypatch.setattr(_fences, "_SCALAR_READS", scalar_reads)
    board = FenceBoard(str(tmp_path), slots=16)
    try:
        for i in range(12):
            board.install(i, i + 1)
        reader = MappedBoard(board.path)
        entries = [board.entry(i) for i in range(12)]
        generations = [i + 1 for i in range(12)]
        assert read_board(reader, entries, generations)  # type: ignore[arg-type]
        assert read_board(reader, entries[:3], generations[:3])  # type: ignore[arg-type]
        board.raise_to(7, 99)
        assert not read_board(reader, entries, generations)  # type: ignore[arg-type]
        assert read_board(reader, entries[:7], generations[:7])  # type: ignore[arg-type]
        board.remove(2)
        assert not read_board(reader, entries[:7], generations[:7])  # type: ignore[arg-type]
        assert not read_board(reader, [(16, entries[0][1])], [1])  # type: ignore[index]
        assert not read_board(reader, [(-1, entries[0][1])], [1])  # type: ignore[index]
    finally:
        board.close()
