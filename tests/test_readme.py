"""The README's tables are the code's tables: API versions and configuration keys.

When one of these fails, the message prints the table as the code has it; paste it between
the markers in README.md.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from rallypoint.config import SETTINGS
from rallypoint.handlers import MODULES
from rallypoint.protocol import codec
from rallypoint.protocol.apis import SERVED_APIS

from tests.support import ROOT

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


def render_default(value: Any) -> str:
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def test_config_table_matches_settings() -> None:
    rows = table_rows("config-table")
    keys = [row[0].strip("`") for row in rows]
    assert keys == list(SETTINGS), "README config-table keys, in SETTINGS order, should be:\n" + "\n".join(SETTINGS)
    for row in rows:
        key, default = row[0].strip("`"), row[1]
        setting = SETTINGS[key]
        if setting.default is None:
            # "no default of its own": empty, or a parenthesised note of what is used instead
            assert default == "" or re.fullmatch(r"\(.+\)", default), f"{key}: {default!r}"
        else:
            assert default == render_default(setting.default), f"{key}: README says {default}"
        assert len(row) == 3 and row[2], f"{key}: the meaning column is empty"


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
