"""cluster.nodes entries: counts bounded, a missing count named, and ranks placed per node
rather than per device (issue 28: reads)."""

from __future__ import annotations

import pytest

from trainlab.vocab.nodes import MAX_NODE_DEVICES, ClusterSpec, NodeSpec, parse_node


@pytest.mark.parametrize("item", ["1000000000000xH100", "99999999999999999999999xH100",
                                  f"{MAX_NODE_DEVICES + 1}xcpu"])
def test_an_absurd_device_count_is_refused_naming_the_bound(item):
    with pytest.raises(ValueError) as e:
        parse_node(item)
    message = str(e.value)
    assert "cluster.nodes" in message and item in message and str(MAX_NODE_DEVICES) in message, message


@pytest.mark.parametrize("item", ["xH100", "XA100", "*H100", "x 8"])
def test_a_missing_count_is_named_not_read_as_a_type(item):
    with pytest.raises(ValueError) as e:
        parse_node(item)
    message = str(e.value)
    assert "cluster.nodes" in message and repr(item) in message and "no count" in message, message
    assert "1xx" not in message, message


def test_a_count_of_one_per_type_still_parses():
    assert parse_node("H100") == NodeSpec("H100", 1)
    assert parse_node(f"{MAX_NODE_DEVICES}xcpu") == NodeSpec("cpu", MAX_NODE_DEVICES)
    assert parse_node("8 x A100") == NodeSpec("A100", 8)


def test_ranks_are_placed_per_node_not_per_device():
    """A huge cluster costs nothing to place a small gang on (no list of every device)."""
    cluster = ClusterSpec(nodes=(NodeSpec("H100", 10**12), NodeSpec("H100", 8)))
    assert cluster.rank_nodes(4) == [0, 0, 0, 0]
    assert ClusterSpec.of_nodes(["2xH100", "2xH100"]).rank_nodes(3) == [0, 0, 1]


def test_a_count_too_long_for_int_is_refused_in_the_same_words():
    with pytest.raises(ValueError, match="more than"):
        parse_node("9" * 5000 + "xH100")
    with pytest.raises(ValueError, match="not COUNTxTYPE"):
        parse_node("0xH100")
