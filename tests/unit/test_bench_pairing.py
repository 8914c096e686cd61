"""``bench.common.paired``: the ratios every store figure is made of come from runs of both sides, alternating, with
the side going first alternating too (neither always meets the state the other leaves)."""

from __future__ import annotations

from bench.common import paired


def test_paired_alternates_the_sides_and_which_goes_first_and_drops_the_warmup() -> None:
    order: list[tuple[str, int]] = []

    def side(name: str, seconds: float) -> object:
        return lambda n: order.append((name, n)) or seconds + n

    ours, floor = paired(side("ours", 1.0), side("floor", 10.0), 3, warmup=1)
    assert order == [
        ("ours", 0), ("floor", 0),
        ("floor", 1), ("ours", 1),
        ("ours", 2), ("floor", 2),
        ("floor", 3), ("ours", 3),
    ]  # fmt: skip
    assert (ours, floor) == (3.0, 12.0)  # medians of runs 1-3: the warm-up run 0 is not counted
