"""Where things are: the repository root and the test clients' folders."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
JS_DIR = ROOT / "tests" / "js"  # kafkajs scripts (npm install puts kafkajs in its node_modules)
