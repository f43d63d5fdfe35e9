"""Reading a rich table back from a command's output."""

from __future__ import annotations


def table_columns(output: str) -> list[str]:
    """Each column of a rich table's body as one string: its cells' lines joined, so a name
    folded over several lines reads whole again."""
    rows = [line.split("│")[1:-1] for line in output.splitlines() if line.startswith("│")]
    return ["".join(cell.strip() for cell in column) for column in zip(*rows, strict=True)]
