"""The live page (``GET /`` of the control server): served self-contained, and followed in a
real headless Chromium (Debian's, driven by Playwright) while a real group rebalances, and while
a share group's records are acquired and released by a clock advance."""

from __future__ import annotations

import re
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from rallypoint.testing import Rallypoint

from tests.support import Member, WireClient
from tests.support.topics import create_topic

pytestmark = pytest.mark.clients

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
GROUP = "live"


def _get(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def test_the_page_is_one_self_contained_html_file() -> None:
    with Rallypoint({"rallypoint.control.token": "s3cret"}) as rp:
        status, _headers, _body = _get(rp.control_url + "/")
        assert status == 401  # the token protects the page too
        status, headers, body = _get(rp.control_url + "/?token=s3cret")
    assert status == 200 and headers["content-type"] == "text/html; charset=utf-8"
    assert "default-src 'none'" in headers["content-security-policy"]
    html = body.decode()
    assert "<script>" in html and "EventSource" in html
    # nothing from elsewhere: no src/href to another origin, no @import, no url() to a host
    assert not re.search(r"""(src|href)\s*=\s*["'](https?:)?//""", html)
    assert "@import" not in html and not re.search(r"url\(\s*['\"]?(https?:)?//", html)


@pytest.fixture
def members() -> Iterator[list[Member]]:
    started: list[Member] = []
    yield started
    for m in started:
        m.kill()


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/setup --test installs it)")
def test_the_page_follows_a_rebalancing_group_in_a_browser(tmp_path: Path, members: list[Member]) -> None:
    from playwright.sync_api import sync_playwright

    config = {"group.initial.rebalance.delay.ms": 0, "num.partitions": 4, "rallypoint.control.token": "tok"}
    with Rallypoint(config, mode="subprocess") as rp:
        with WireClient("127.0.0.1", rp.port) as w:
            w.call(3, 4, {"topics": [{"name": "t"}], "allow_auto_topic_creation": True})
        members.append(Member("confluent", rp, GROUP, ["t"], client_id="live-1", heartbeat_ms=250))
        first = rp.wait_group(GROUP, state="Stable", members=1, timeout=30)
        elsewhere: list[str] = []
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                page.on("request", lambda r: None if r.url.startswith(rp.control_url) else elsewhere.append(r.url))
                page.goto(f"{rp.control_url}/?token=tok")
                card = f'[data-group="{GROUP}"]'
                page.wait_for_selector(f'{card}[data-state="Stable"][data-members="1"]', timeout=15_000)
                assert page.get_attribute(card, "data-generation") == str(first["generation"])
                shown = page.locator(f"{card} .member").all_inner_texts()
                assert shown == [m["member_id"] for m in first["members"]]
                page.wait_for_selector("#live.on", timeout=15_000)  # the event stream is open
                page.evaluate("window.notReloaded = true")

                members.append(Member("confluent", rp, GROUP, ["t"], client_id="live-2", heartbeat_ms=250))
                second = rp.wait_group(
                    GROUP, state="Stable", members=2, min_generation=first["generation"] + 1, timeout=30
                )
                page.wait_for_selector(f'{card}[data-state="Stable"][data-members="2"]', timeout=15_000)
                assert int(page.get_attribute(card, "data-generation") or -1) >= second["generation"]
                shown = page.locator(f"{card} .member").all_inner_texts()
                assert sorted(shown) == sorted(m["member_id"] for m in second["members"])
                assert page.evaluate("window.notReloaded") is True  # updated live, not reloaded
                assert page.locator("#requests tbody tr").count() > 0  # the request log is shown
                page.screenshot(path=str(tmp_path / "live-page.png"), full_page=True)
            finally:
                browser.close()
        assert not elsewhere, f"the page fetched from elsewhere: {elsewhere}"
    assert (tmp_path / "live-page.png").stat().st_size > 10_000


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (scripts/setup --test installs it)")
def test_the_page_shows_a_share_group_with_its_in_flight_records(tmp_path: Path) -> None:
    """A ShareConsumer holds records: the share group's card shows the member and the acquired
    count; after a clock advance past the lock duration the count moves to available, live."""
    import confluent_kafka as ck
    from confluent_kafka import admin
    from playwright.sync_api import sync_playwright

    group, topic = "live-share", "queued"
    with Rallypoint({"group.initial.rebalance.delay.ms": 0}, mode="subprocess") as rp:
        with WireClient("127.0.0.1", rp.port) as w:
            create_topic(w, topic, 1)
        entry = admin.ConfigEntry(
            "share.auto.offset.reset", "earliest", incremental_operation=admin.AlterConfigOpType.SET
        )
        resource = admin.ConfigResource(admin.ResourceType.GROUP, group, incremental_configs=[entry])
        client = admin.AdminClient({"bootstrap.servers": rp.bootstrap})  # alive until the futures resolve
        for f in client.incremental_alter_configs([resource]).values():
            f.result(10)
        producer = ck.Producer({"bootstrap.servers": rp.bootstrap})
        for i in range(6):
            producer.produce(topic, f"m{i}".encode())
        assert producer.flush(15) == 0
        holder = ck.ShareConsumer(
            {
                "bootstrap.servers": rp.bootstrap,
                "group.id": group,
                "client.id": "holder",
                "share.acknowledgement.mode": "explicit",
            }
        )
        try:
            holder.subscribe([topic])
            held: list[ck.Message] = []
            deadline = time.monotonic() + 20
            while not held and time.monotonic() < deadline:
                held = [m for m in holder.poll(0.5) if m.error() is None]
            assert held, "the share consumer acquired nothing"
            view = rp.wait_group(group, state="Stable", members=1, timeout=10)
            acquired = view["share_partitions"][0]["in_flight"]["acquired"]
            assert acquired >= len(held)
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
                try:
                    page = browser.new_page(viewport={"width": 1400, "height": 900})
                    page.goto(rp.control_url + "/")
                    card = f'[data-group="{group}"][data-type="share"]'
                    page.wait_for_selector(f'{card}[data-state="Stable"][data-members="1"]', timeout=15_000)
                    assert page.locator(f"{card} .member").all_inner_texts() == [view["members"][0]["member_id"]]
                    assert page.locator(f"{card} .in-acquired").inner_text() == str(acquired)
                    assert page.locator(f"{card} .in-available").inner_text() == "0"
                    page.wait_for_selector("#live.on", timeout=15_000)
                    rp.advance_clock(30_001)  # past the 30 s lock
                    page.wait_for_function(
                        """([card, n]) => {
                             const a = document.querySelector(card + " .in-available");
                             const q = document.querySelector(card + " .in-acquired");
                             return a && q && a.textContent === n && q.textContent === "0";
                           }""",
                        arg=[card, str(acquired)],
                        timeout=10_000,
                    )
                    page.screenshot(path=str(tmp_path / "live-share.png"), full_page=True)
                finally:
                    browser.close()
        finally:
            holder.close()
