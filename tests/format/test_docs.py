"""docs/format.md, the public contract, against the code: the preset table and the sizes."""

from __future__ import annotations

import re
from pathlib import Path

from fp4quant import QuantConfig
from fp4quant.format.config import PRESETS

FORMAT_MD = Path(__file__).resolve().parents[2] / "docs" / "format.md"


def preset_table() -> dict[str, dict[str, str]]:
    """The rows of the table under "## Presets": preset name -> {column: cell}."""
    text = FORMAT_MD.read_text()
    section = text[text.index("## Presets") :]
    section = section[: section.find("\n## ", 1)] if "\n## " in section[1:] else section  # up to the next section
    lines = [ln.strip() for ln in section.splitlines() if ln.strip().startswith("|")]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    header, rows = cells[0], cells[2:]  # cells[1] is the |---| line
    assert header[0] == "preset", header
    return {r[0].strip("`"): dict(zip(header[1:], r[1:])) for r in rows}


def test_the_preset_table_lists_every_preset_with_every_field():
    table = preset_table()
    assert list(table) == list(PRESETS)
    fields = [f for f in QuantConfig().to_dict()]
    for name, row in table.items():
        config = QuantConfig.preset(name)
        assert set(row) == set(fields) | {"bits/value"}, (name, sorted(row))
        for field in fields:
            assert row[field] == str(getattr(config, field)), f"docs/format.md says {name}.{field} = {row[field]}"
        assert float(row["bits/value"]) == round(config.bits_per_value, 3), (name, row["bits/value"])


def test_the_worked_size_example_is_the_default_config():
    text = FORMAT_MD.read_text()
    m = re.search(r"fp4quant at `group=(\d+)`:\s+4 \+ ([\d.]+) \+ ([\d.]+) = ([\d.]+) bits, ([\d.]+)x smaller", text)
    assert m, "the bits-per-value example is missing from docs/format.md"
    group, micro, coarse, total, ratio = int(m[1]), *map(float, m.groups()[1:])
    config = QuantConfig()
    assert group == config.group
    assert (micro, coarse) == (8 / config.micro_group, 32 / config.group)
    assert total == config.bits_per_value
    assert ratio == round(16 / config.bits_per_value, 2)
