"""Values members keep are shared between members where equal (coordinator/handlers/
_groups_common.py, ``shared``): one object each, a bounded cache, nothing else changed."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from rallypoint.groups.events import Protocol
from rallypoint.handlers import _groups_common as common
from rallypoint.handlers.join_group import _protocols

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def empty_cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(common, "_SHARED", {})
    yield


def test_equal_values_become_one_object() -> None:
    a = "".join(["con", "sumer"])
    b = "".join(["cons", "umer"])
    assert a == b and a is not b
    assert common.shared(a) is common.shared(b) is a
    x, y = bytes(bytearray(b"sub")), bytes(bytearray(b"sub"))
    assert common.shared(x) is common.shared(y) is x


def test_equal_values_of_other_types_stay_apart() -> None:
    assert common.shared(1) == 1
    assert common.shared(True) is True  # equal to the int 1 kept before, but a bool
    assert type(common.shared(1.0)) is float


def test_long_strings_and_bytes_are_not_kept() -> None:
    long = "c" * (common.SHARED_BYTES_MAX + 1)
    assert common.shared(long) is long
    assert not common._SHARED
    edge = "c" * common.SHARED_BYTES_MAX
    assert common.shared(edge) is edge and len(common._SHARED) == 1


def test_the_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "_SHARED_MAX", 10)
    for i in range(50):
        common.shared(f"client-{i}")
    assert len(common._SHARED) == 10
    late = "".join(["client-", "49"])
    assert common.shared(late) is late  # not kept: returned as it is


def test_members_offering_the_same_small_protocols_share_one_tuple() -> None:
    def request(meta: bytes) -> list[SimpleNamespace]:
        return [SimpleNamespace(name="range", metadata=bytearray(meta)), SimpleNamespace(name="rr", metadata=b"")]

    first, second = _protocols(request(b"\x00\x01t")), _protocols(request(b"\x00\x01t"))
    assert first is second and first == (Protocol("range", b"\x00\x01t"), Protocol("rr", b""))
    big = b"x" * (common.SHARED_BYTES_MAX + 1)
    one, two = _protocols(request(big)), _protocols(request(big))
    assert one == two and one is not two
