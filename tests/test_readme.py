"""The README's tables are the code's tables: API versions and configuration keys.

The config table is generated: ``make readme`` rewrites it from coordinator/config.py.  When the
API table check fails, its message prints the table as the code has it; paste it between the
markers in README.md.
"""

from __future__ import annotations

import importlib
import re

import pytest
from rallypoint.config import SETTINGS, markdown_table
from rallypoint.handlers import MODULES
from rallypoint.protocol import codec
from rallypoint.protocol.apis import SERVED_APIS

from tests.support import ROOT

pytestmark = pytest.mark.unit

README = (ROOT / "README.md").read_text(encoding="utf-8")


def table_rows(name: str) -> list[list[str]]:
    """Cells of the data rows between ``<!-- {name}:start -->`` and ``<!-- {name}:end -->``."""
    match = re.search(rf"<!-- {name}:start -->\n(.*?)<!-- {name}:end -->", README, re.S)
    assert match, f"README.md has no {name} markers"
    lines = [line.strip() for line in match.group(1).strip().splitlines()]
    assert len(lines) >= 2 and re.fullmatch(r"\|(\s*-+\s*\|)+", lines[1].replace(" ", "")), "no table header"
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


EN_DASH = "\u2013"  # the README writes version ranges as 0\u201313


def expected_api_rows() -> list[list[str]]:
    rows = []
    for api in sorted(SERVED_APIS.values(), key=lambda a: a.key):
        versions = f"{api.min_version}{EN_DASH}{api.max_version}"
        if api.min_version == api.max_version:
            versions = str(api.min_version)
        rows.append([api.name, str(api.key), versions])
    return rows


def _render(rows: list[list[str]]) -> str:
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def test_api_table_matches_served_apis() -> None:
    expected = expected_api_rows()
    assert table_rows("api-table") == expected, "README api-table should be:\n" + _render(expected)


def test_config_table_is_generated_from_settings() -> None:
    """The config table is rendered from the settings table (``make readme`` rewrites it)."""
    match = re.search(r"<!-- config-table:start -->\n(.*?)<!-- config-table:end -->", README, re.S)
    assert match, "README.md has no config-table markers"
    assert match.group(1) == markdown_table(), "README config-table is stale: run `make readme`"
    keys = [row[0].strip("`") for row in table_rows("config-table")]
    assert keys == list(SETTINGS)
    assert all(s.doc for s in SETTINGS.values()), "every setting says what it means"


def test_handler_modules_and_served_apis_agree() -> None:
    assert set(MODULES) == set(SERVED_APIS), "every served API has a handler module and vice versa"
    for key, name in MODULES.items():
        mod = importlib.import_module(f"rallypoint.handlers.{name}")
        assert mod.API_KEY == key, name
        # the table's name is Kafka's (kio's schema name is the same words in snake case)
        assert SERVED_APIS[key].name.lower() == name.replace("_", ""), (key, name)
        lo, hi = codec.codec_versions(key) or (None, None)
        assert lo is not None and hi is not None
        assert lo <= SERVED_APIS[key].min_version <= SERVED_APIS[key].max_version <= hi, "beyond the codec"


def test_layout_names_only_paths_that_exist() -> None:
    layout = README.split("## Layout", 1)[1]
    paths = set(re.findall(r"`((?:coordinator|protocol|pipeline|tests|bench|scripts|docs)/[\w./-]*)`", layout))
    assert paths, "the Layout section names no paths"
    assert sorted(p for p in paths if not (ROOT / p).exists()) == []
    for module in re.findall(r"`(\w+\.py)`", layout):  # bare module names live in one of the folders
        assert any((ROOT / d / module).exists() for d in ("coordinator", "protocol", "pipeline", "tests")), module
