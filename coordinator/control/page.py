"""The live page: ``GET /`` of the control server (docs/control.md, "The live page").

One self-contained HTML file (``page.html``, inline CSS and JavaScript, no framework, nothing
fetched from elsewhere) that loads the state from the /v1 endpoints and follows /v1/events.
"""

from __future__ import annotations

import functools
from importlib import resources


@functools.cache
def live_page() -> bytes:
    return resources.files(__package__).joinpath("page.html").read_bytes()
