#!/usr/bin/env python3
"""Where the CUDA driver placed PyTorch's segments: the rules of `AddressOrder` scored against the
addresses the driver gave every `cudaMalloc` of the recorded traces
(`tests/fixtures/hf-traces/*.json.gz`, an H200, driver 580.159.04, CUDA 13.0; the traces under
expandable segments left out: their address ranges are reserved otherwise).

    scripts/segment-addresses.py [--scan]

Only the order of a pool's segments matters (it breaks ties between equal free blocks), so a
placement is scored by the pairs of live segments of the same pool (2 MiB segments: the small
pool) it orders as the driver did, and by the segments it orders right against every live one.
With --scan, the driver's rule for each size of the space left unused above the first segment.
Also printed: how many segments placed below all the others began on a 32 MiB boundary and right
below the lowest before them. Standard library only.
"""
import gzip
import json
import sys
from pathlib import Path

MIB = 1 << 20
GRANULE = 32 * MIB
FIRST_UNUSED = 416 * MIB
SMALL_SEGMENT = 2 * MIB
TRACES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "hf-traces"


class Descending:
    """Each new segment right below the previous one."""

    def __init__(self):
        self.next = 0

    def place(self, size):
        self.next -= size
        return self.next


class Ascending:
    """Each new segment right above the previous one."""

    def __init__(self):
        self.next = 0

    def place(self, size):
        self.next += size
        return self.next - size


class Driver:
    """`AddressOrder::Driver`: the low end of the lowest unused range that holds the segment, else
    of new 32 MiB granules reserved below all the others. The first segment (the 2 MiB one
    `torch.zeros(1)` made before each trace began) lies at 0 with `first_unused` bytes above it."""

    def __init__(self, first_unused=FIRST_UNUSED):
        self.bottom = 0
        self.unused = [[SMALL_SEGMENT, SMALL_SEGMENT + first_unused]] if first_unused else []

    def place(self, size):
        holding = [r for r in self.unused if r[1] - r[0] >= size]
        if holding:
            r = min(holding)
            start, r[0] = r[0], r[0] + size
            if r[0] == r[1]:
                self.unused.remove(r)
            return start
        reserved = -(-size // GRANULE) * GRANULE
        self.bottom -= reserved
        if reserved > size:
            self.unused.append([self.bottom + size, self.bottom + reserved])
        return self.bottom


def segments(path):
    """The sizes and addresses of a trace's new segments, in order; None under expandable
    segments. No trace frees a segment."""
    record = json.load(gzip.open(path))
    if "expandable_segments:True" in (record["environment"].get("alloc_conf") or ""):
        return None
    events = record["trace"]["events"]
    assert not any(e[0] == "segment_free" for e in events), path
    return [(e[2], e[1]) for e in events if e[0] == "segment_alloc"]


def score(traces, make):
    """Pairs of live same-pool segments ordered as the driver did, and segments ordered right
    against every live segment of their pool (of those with any)."""
    pairs = [0, 0]
    whole = [0, 0]
    for segs in traces:
        rule, live = make(), []
        for size, real in segs:
            placed = rule.place(size)
            same = [(r, p) for s, r, p in live if (s == SMALL_SEGMENT) == (size == SMALL_SEGMENT)]
            right = sum((real > r) == (placed > p) for r, p in same)
            pairs[0] += right
            pairs[1] += len(same)
            if same:
                whole[0] += right == len(same)
                whole[1] += 1
            live.append((size, real, placed))
    return pairs, whole


def granules(traces):
    """Of the segments placed below every other: how many begin on a 32 MiB boundary, and how
    many right below the lowest granule before them."""
    below = aligned = adjacent = 0
    for segs in traces:
        lowest = None
        for size, real in segs[1:]:
            if lowest is not None and real < lowest:
                below += 1
                aligned += real % GRANULE == 0
                adjacent += real + -(-size // GRANULE) * GRANULE == lowest
            lowest = real if lowest is None else min(lowest, real)
    return below, aligned, adjacent


def main():
    traces = [s for s in map(segments, sorted(TRACES.glob("*.json.gz"))) if s]
    print(f"{len(traces)} traces, {sum(map(len, traces))} segments")
    rules = {"descending": Descending, "ascending": Ascending, "driver": Driver}
    if "--scan" in sys.argv:
        rules = {f"driver, {k} MiB unused above the first": (lambda k=k: Driver(k * MIB))
                 for k in range(0, 641, 32)}
    for name, make in rules.items():
        (right, pairs), (whole, live) = score(traces, make)
        print(f"{name:<40} pairs {right}/{pairs} ({100 * right / pairs:.2f} %), "
              f"segments {whole}/{live} ({100 * whole / live:.1f} %)")
    below, aligned, adjacent = granules(traces)
    print(f"placed below all others: {below}; on a 32 MiB boundary: {aligned}; "
          f"right below the lowest granule: {adjacent}")


if __name__ == "__main__":
    main()
