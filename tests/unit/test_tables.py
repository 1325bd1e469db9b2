from devplug.ground.tables import table


def test_columns_are_padded_to_the_widest_cell() -> None:
    assert table(["A", "LONG"], [["xyz", "1"], ["q", "22"]], indent="  ") == [
        "  A    LONG",
        "  xyz  1",
        "  q    22",
    ]


def test_without_header_or_rows() -> None:
    assert table(None, [["a", "bb"], ["ccc", "d"]]) == ["a    bb", "ccc  d"]
    assert table(None, []) == []
