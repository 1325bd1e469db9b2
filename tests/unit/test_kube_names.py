"""The names Kubernetes accepts, written once (devplug.kube.names): each rule at its
edges, as the API machinery's validation draws them."""

from __future__ import annotations

import pytest

from devplug.kube.names import (
    is_dns_label,
    is_dns_subdomain,
    is_label_value,
    is_qualified_name_part,
    label_value,
)


@pytest.mark.parametrize(
    ("name", "ok"),
    [("a", True), ("slot-0", True), ("a" * 63, True), ("a" * 64, False), ("-a", False),
     ("a-", False), ("A", False), ("a.b", False), ("", False), ("a_b", False)],
)  # fmt: skip
def test_a_dns_label_is_63_lower_case_letters_digits_and_inner_dashes(name: str, ok: bool) -> None:
    assert is_dns_label(name) is ok


@pytest.mark.parametrize(
    ("name", "ok"),
    [("example.com", True), ("gpu.example.com", True), ("a" * 253, True), ("a" * 254, False),
     ("a..b", False), (".a", False), ("a.", False), ("Example.com", False), ("", False)],
)  # fmt: skip
def test_a_dns_subdomain_is_dns_labels_joined_by_dots_at_most_253(name: str, ok: bool) -> None:
    assert is_dns_subdomain(name) is ok


def test_a_field_may_hold_a_dns_subdomain_to_a_shorter_length() -> None:
    assert is_dns_subdomain("a" * 63, 63)
    assert not is_dns_subdomain("a" * 64, 63)


@pytest.mark.parametrize(
    ("name", "ok"),
    [("fpga", True), ("U280.count", True), ("a_b-c.d", True), ("a" * 63, True),
     ("a" * 64, False), ("_a", False), ("a.", False), ("", False), ("a/b", False)],
)  # fmt: skip
def test_a_qualified_names_part_is_63_of_letters_digits_dash_dot_underscore(
    name: str, ok: bool
) -> None:
    assert is_qualified_name_part(name) is ok


def test_a_label_value_may_be_empty_and_is_otherwise_a_qualified_names_part() -> None:
    assert is_label_value("")
    assert is_label_value("A100")
    assert not is_label_value("a b")
    assert not is_label_value("x" * 64)


def test_any_text_becomes_a_valid_label_value() -> None:
    assert label_value(" Alveo U280 (rev 2) ") == "Alveo-U280-rev-2"
    assert label_value("x" * 100) == "x" * 63
    for text in ("", "---", "a/b:c", "é" * 10, "a" * 62 + "-b"):
        assert is_label_value(label_value(text))
