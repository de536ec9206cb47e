"""QuantConfig: validation names the bad field, presets, derived quantities."""

from __future__ import annotations

import dataclasses

import pytest

from fp4quant import QuantConfig
from fp4quant.format.config import PRESETS, as_config


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"micro_group": 12}, "micro_group"),
        ({"micro_group": 1}, "micro_group"),
        ({"group": 100}, "group"),
        ({"group": 8}, "group"),  # smaller than micro_group
        ({"group": 1 << 17}, "group"),
        ({"micro_scale": "e5m2"}, "micro_scale"),
        ({"coarse_scale": "row"}, "coarse_scale"),
        ({"fwht": "one_level"}, "fwht"),
        ({"fwht_seed": -1}, "fwht_seed"),
        ({"fwht_seed": 1.5}, "fwht_seed"),
        ({"rounding": "down"}, "rounding"),
        ({"packing": "tight"}, "packing"),
        ({"element": "e3m0"}, "element"),
        ({"scale_round": "floor"}, "scale_round"),  # floor is an e8m0 rule
        ({"micro_scale": "e8m0"}, "coarse_scale"),  # e8m0 wants no coarse scale
        ({"micro_scale": "none", "coarse_scale": "none"}, "coarse_scale"),
    ],
)
def test_invalid_field_raises_value_error_naming_it(kwargs, field):
    with pytest.raises(ValueError, match=rf"QuantConfig\.{field}\b"):
        QuantConfig(**kwargs)


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        QuantConfig().group = 512  # type: ignore[misc]


def test_default_is_the_fp4quant_preset():
    c = QuantConfig.preset("fp4quant")
    assert c == QuantConfig()
    assert (c.element, c.micro_group, c.micro_scale, c.coarse_scale, c.fwht) == ("e2m1", 16, "e4m3", "group", "two_level")
    assert c.packing == "warp" and c.rounding == "nearest"


def test_presets_exist_and_ablations_differ_in_one_mechanism():
    assert set(PRESETS) >= {"fp4quant", "no_fwht", "single_scale", "naive_pack", "nvfp4", "mxfp4", "int4", "fp8", "bf16"}
    base = QuantConfig.preset("fp4quant").to_dict()
    for name, field in (("no_fwht", "fwht"), ("single_scale", "coarse_scale"), ("naive_pack", "packing")):
        diff = {k for k, v in QuantConfig.preset(name).to_dict().items() if base[k] != v}
        assert diff == {field}, name


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset 'fp3'"):
        QuantConfig.preset("fp3")


def test_preset_overrides_and_replace_validate():
    c = QuantConfig.preset("fp4quant", rounding="stochastic")
    assert c.rounding == "stochastic"
    with pytest.raises(ValueError, match="QuantConfig.group"):
        c.replace(group=3)


def test_default_scale_round_is_resolved():
    assert QuantConfig.preset("mxfp4").scale_round == "floor"
    assert QuantConfig().scale_round == "nearest"
    assert QuantConfig(scale_round="nearest") == QuantConfig()


@pytest.mark.parametrize(
    "name, bits",
    [("fp4quant", 4.515625), ("no_fwht", 4.515625), ("single_scale", 4.5), ("nvfp4", 4.5), ("mxfp4", 4.25),
     ("int4", 4.5), ("fp8", 8.015625), ("bf16", 16.0)],
)
def test_bits_per_value(name, bits):
    assert QuantConfig.preset(name).bits_per_value == bits


def test_fp4quant_default_at_most_4_7_bits():
    c = QuantConfig()
    assert c.bits_per_value <= 4.7
    assert 16 / c.bits_per_value >= 3.4
    assert QuantConfig(group=256).bits_per_value == 4.625 <= 4.7


def test_dict_round_trip_and_str():
    for name in PRESETS:
        c = QuantConfig.preset(name)
        assert QuantConfig.from_dict(c.to_dict()) == c
        assert str(c) == name
    assert "group=512" in str(QuantConfig(group=512))
    with pytest.raises(ValueError, match="no field"):
        QuantConfig.from_dict({"grup": 3})


@pytest.mark.parametrize("name", ["fp4quant", "single_scale", "nvfp4", "mxfp4", "int4"])
def test_stochastic_rounding_rounds_scales_up(name):
    # a scale rounded down would saturate its micro-group's largest values: biased
    assert QuantConfig.preset(name, rounding="stochastic").scale_round == "up"
    assert QuantConfig.preset(name).replace(rounding="stochastic").scale_round == "up"
    assert QuantConfig.preset(name).replace(rounding="stochastic").replace(rounding="nearest") == QuantConfig.preset(name)


def test_stochastic_rounding_without_micro_scales_has_nothing_to_round():
    assert QuantConfig.preset("fp8", rounding="stochastic").scale_round == "nearest"


@pytest.mark.parametrize("micro_scale, rule", [("e4m3", "nearest"), ("fp16", "nearest"), ("e8m0", "floor")])
def test_saturating_scale_rule_with_stochastic_rounding_is_rejected(micro_scale, rule):
    with pytest.raises(ValueError, match=r"QuantConfig\.scale_round must be 'up' .* rounding='stochastic'"):
        QuantConfig(micro_scale=micro_scale, coarse_scale="none", scale_round=rule, rounding="stochastic")


def test_an_explicit_scale_rule_survives_replace():
    assert QuantConfig(scale_round="up").replace(group=256).scale_round == "up"
    assert QuantConfig(scale_round="up").replace(rounding="nearest").scale_round == "up"


def test_as_config_accepts_names_and_configs_only():
    assert as_config("nvfp4") == QuantConfig.preset("nvfp4")
    c = QuantConfig(group=512)
    assert as_config(c) is c
    with pytest.raises(ValueError, match="unknown preset 'fp3'"):
        as_config("fp3")
    with pytest.raises(TypeError, match="config must be a QuantConfig or a preset name"):
        as_config({"group": 512})
