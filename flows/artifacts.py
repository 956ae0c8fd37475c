"""What a run produced, as Prefect markdown artifacts: visible in the Prefect UI."""

from __future__ import annotations

import re
from typing import Any


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """A markdown table of rows (the keys of the first row are the columns)."""
    if not rows:
        return "_nothing_"
    cols = list(rows[0])

    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4f}"
        return "" if v is None else str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def artifact_key(text: str) -> str:
    """A Prefect artifact key: lowercase letters, digits and dashes."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9]+", "-", text.lower())).strip("-")


def publish(key: str, title: str, rows: list[dict[str, Any]], notes: str = "") -> None:
    """Create a markdown artifact with a title and a table (inside a flow run)."""
    from prefect.artifacts import create_markdown_artifact

    body = f"### {title}\n\n{markdown_table(rows)}\n" + (f"\n{notes}\n" if notes else "")
    create_markdown_artifact(markdown=body, key=artifact_key(key), description=title)
