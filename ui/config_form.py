"""The "Advanced" accordion, generated from the fields of the engine's config dataclass.

The form is derived from ``dataclasses.fields(SixBitConfig)`` at start-up, so a threshold added to the
engine appears in the UI without touching this file. Scalar fields (bool, int, float, a ``Literal``
or a ``choices`` set, and ``Optional`` of those) become components; free-text fields appear only with
the fixed choices of `MAPPED_TEXT` (a typed text could name a file on the server); other fields
(tables, nested objects) are not user settings and are left out. Field ``metadata`` may carry
``help``, ``label``, ``min``, ``max`` and ``choices``; they are used when present.

A request's config is ``Config.preset(preset, **overrides)``. The overrides are the fields the user
edited: those whose value differs from the preset the form was last filled from (``form_preset``; the
preset radio refills the form). So picking a preset and leaving the accordion alone runs the preset
as the engine defines it — also for an API caller who sends ``preset="aggressive"`` and leaves the
Advanced inputs at their defaults (the form starts filled with "balanced").
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from typing import Any

import gradio as gr

PRESETS = ("off", "balanced", "aggressive")

# Free-text fields may name files on the server (the policy is "a JSON path"): a web form must not let
# users open arbitrary paths, so known ones get fixed choices (label -> value) and any other free-text
# field is left out of the form.
MAPPED_TEXT = {
    "policy": {"auto (shipped policy for the model)": "auto", "none (uncalibrated E = Γ)": None},
}
PRESET_LABELS = {"off": "Off (full precision)", "balanced": "Balanced", "aggressive": "Aggressive"}


@dataclass
class FieldSpec:
    name: str
    kind: str  # "bool" | "int" | "float" | "choice" | "mapped" (fixed label -> value choices)
    optional: bool = False
    label: str = ""
    info: str | None = None
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple | None = None
    mapping: dict | None = None  # kind "mapped": label shown -> value passed to the config


def _unwrap_optional(tp) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, getattr(types, "UnionType", None)):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def field_specs(config_cls) -> list[FieldSpec]:
    """One `FieldSpec` per scalar field of the dataclass ``config_cls``, in declaration order."""
    hints = typing.get_type_hints(config_cls)
    specs = []
    for f in dataclasses.fields(config_cls):
        if not f.init or f.name.startswith("_"):
            continue
        tp, optional = _unwrap_optional(hints.get(f.name, f.type))
        md = dict(f.metadata or {})
        choices = md.get("choices")
        if typing.get_origin(tp) is typing.Literal:
            kind, choices = "choice", tuple(typing.get_args(tp))
        elif choices:
            kind = "choice"
        elif tp is bool:
            kind = "bool"
        elif tp is int:
            kind = "int"
        elif tp is float:
            kind = "float"
        elif tp is str and f.name in MAPPED_TEXT:
            kind = "mapped"
        else:
            continue  # not a user-facing scalar, or free text (see MAPPED_TEXT)
        label = md.get("label") or f.name.replace("_", " ")
        specs.append(FieldSpec(name=f.name, kind=kind, optional=optional, label=label,
                               info=md.get("help") or md.get("doc"), minimum=md.get("min"),
                               maximum=md.get("max"), choices=tuple(choices) if choices else None,
                               mapping=MAPPED_TEXT.get(f.name) if kind == "mapped" else None))
    return specs


def make_component(spec: FieldSpec, value) -> gr.components.Component:
    """The component of one field; ``value`` as the form shows it (see `to_display`, `preset_values`)."""
    common = dict(label=spec.label, info=spec.info, elem_id=f"adv-{spec.name}", interactive=True)
    if spec.kind == "bool":
        return gr.Checkbox(value=bool(value), **common)
    if spec.kind == "choice":
        return gr.Dropdown(choices=list(spec.choices), value=value, **common)
    if spec.kind == "mapped":
        return gr.Dropdown(choices=list(spec.mapping), value=value, **common)
    return gr.Number(value=value, precision=0 if spec.kind == "int" else None,
                     minimum=spec.minimum, maximum=spec.maximum, **common)


def to_display(spec: FieldSpec, value):
    """A config value as its component shows it (only "mapped" fields differ)."""
    if spec.kind != "mapped":
        return value
    for label, v in spec.mapping.items():
        if v == value:
            return label
    return None


def preset_values(config_cls, preset: str, specs: list[FieldSpec]) -> list:
    cfg = config_cls.preset(preset)
    return [to_display(s, getattr(cfg, s.name)) for s in specs]


def _coerce(spec: FieldSpec, value):
    """A component's value → the field's Python type; raises ValueError with the field's name."""
    if spec.kind == "mapped":
        if value not in spec.mapping:
            raise ValueError(f"{spec.label} must be one of {list(spec.mapping)}, got {value!r}")
        return spec.mapping[value]
    blank = value is None or (isinstance(value, str) and not value.strip())
    if blank and spec.optional:
        return None
    if blank:
        raise ValueError(f"{spec.label} is empty")
    if spec.kind == "bool":
        if isinstance(value, str):
            if value.strip().lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"{spec.label} must be true or false, got {value!r}")
            return value.strip().lower() in ("true", "1")
        return bool(value)
    if spec.kind == "int":
        x = float(value)
        if not math.isfinite(x) or x != int(x):
            raise ValueError(f"{spec.label} must be a whole number, got {value!r}")
        x = int(x)
    elif spec.kind == "float":
        x = float(value)
        if not math.isfinite(x):
            raise ValueError(f"{spec.label} must be a finite number, got {value!r}")
    else:  # "choice": also accept the string form of a non-string choice (e.g. "64" for 64)
        for c in spec.choices:
            if value == c or str(value) == str(c):
                return c
        raise ValueError(f"{spec.label} must be one of {list(spec.choices)}, got {value!r}")
    if spec.minimum is not None and x < spec.minimum:
        raise ValueError(f"{spec.label} must be >= {spec.minimum}, got {x}")
    if spec.maximum is not None and x > spec.maximum:
        raise ValueError(f"{spec.label} must be <= {spec.maximum}, got {x}")
    return x


def overrides(config_cls, preset: str, specs: list[FieldSpec], values: list, form_preset: str | None = None) -> dict:
    """Fields whose submitted value differs from ``form_preset``'s (default: ``preset``'s), i.e. what the
    user edited after the form was filled; raises ``gr.Error`` on a bad value or an unknown preset."""
    preset = (preset or "").strip().lower()
    form_preset = (form_preset or preset).strip().lower()
    for p in (preset, form_preset):
        if p not in PRESETS:
            raise gr.Error(f"Unknown 6Bit preset {p!r}: choose one of {', '.join(PRESETS)}.", title="Invalid input")
    if len(values) != len(specs):
        raise gr.Error(f"Expected {len(specs)} advanced settings, got {len(values)}.", title="Invalid input")
    base = config_cls.preset(form_preset)
    out = {}
    for spec, value in zip(specs, values):
        try:
            v = _coerce(spec, value)
        except (TypeError, ValueError) as e:
            raise gr.Error(f"Advanced setting: {e}.", title="Invalid input") from None
        if v != getattr(base, spec.name):
            out[spec.name] = v
    return out


def build_config(config_cls, preset: str, over: dict):
    """``config_cls.preset(preset, **over)``; the engine's own validation errors become ``gr.Error``."""
    try:
        return config_cls.preset(preset, **over)
    except (TypeError, ValueError) as e:
        raise gr.Error(f"Invalid 6Bit settings: {e}", title="Invalid input") from None
