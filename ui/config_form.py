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
import html
import math
import types
import typing
from dataclasses import dataclass
from typing import Any

import gradio as gr

from ui.validate import refuse, shown

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


def restrict_choices(specs: list[FieldSpec], available: dict[str, tuple[tuple, str]]) -> list[FieldSpec]:
    """``specs`` with the choices of some fields cut to what this host can run: ``available[name] =
    (choices kept, why the others are absent)``; the reason is appended to the field's help."""
    out = []
    for s in specs:
        if s.name in available and s.choices:
            keep, why = available[s.name]
            s = dataclasses.replace(s, choices=tuple(c for c in s.choices if c in keep),
                                    info=f"{s.info or ''} {why}".strip())
        out.append(s)
    return out


def accepted(spec: FieldSpec) -> str:
    """What a field accepts, in words (for messages)."""
    if spec.kind == "bool":
        text = "true or false"
    elif spec.kind in ("choice", "mapped"):
        text = "one of " + ", ".join(repr(str(c)) for c in (spec.mapping or spec.choices))
    else:
        text = "a whole number" if spec.kind == "int" else "a number"
        if spec.minimum is not None and spec.maximum is not None:
            text += f" from {spec.minimum:g} to {spec.maximum:g}"
        elif spec.minimum is not None:
            text += f" ≥ {spec.minimum:g}"
        elif spec.maximum is not None:
            text += f" ≤ {spec.maximum:g}"
    return text + (", or empty" if spec.optional else "")


def make_component(spec: FieldSpec, value) -> gr.components.Component:
    """The component of one field; ``value`` as the form shows it (see `to_display`, `preset_values`).

    Optional numbers are text boxes: a number box shows (and, once the accordion is opened, sends) 0 for
    an empty value, and empty must stay empty. Number boxes get no Gradio precision or bounds: Gradio
    would round a fraction silently and refuse a bound without naming the field; `_coerce` checks both
    with the field's name. Choices are shown as text, so the API documents and accepts strings."""
    common = dict(label=spec.label, info=spec.info, elem_id=f"adv-{spec.name}", interactive=True)
    if spec.kind == "bool":
        return gr.Checkbox(value=bool(value), **common)
    if spec.kind == "choice":
        return gr.Dropdown(choices=[str(c) for c in spec.choices], value=value, **common)
    if spec.kind == "mapped":
        return gr.Dropdown(choices=list(spec.mapping), value=value, **common)
    if spec.optional:
        return gr.Textbox(value=value, max_lines=1, placeholder="empty", **common)
    return gr.Number(value=value, **common)


def to_display(spec: FieldSpec, value):
    """A config value as its component shows it: the label of a "mapped" value, the text of a choice,
    an optional number as text ("" for None)."""
    if spec.kind == "mapped":
        for label, v in spec.mapping.items():
            if v == value:
                return label
        return None
    if spec.kind == "choice":
        return None if value is None else str(value)
    if spec.optional and spec.kind in ("int", "float"):
        return "" if value is None else repr(value)
    return value


def preset_values(config_cls, preset: str, specs: list[FieldSpec]) -> list:
    cfg = config_cls.preset(preset)
    return [to_display(s, getattr(cfg, s.name)) for s in specs]


def _coerce(spec: FieldSpec, value):
    """A component's value → the field's Python type; raises ValueError naming the field and what it takes."""
    def bad():
        return ValueError(f"{spec.label} must be {accepted(spec)}; got {shown(value)}")

    if spec.kind == "mapped":
        if not isinstance(value, str) or value not in spec.mapping:
            raise bad()
        return spec.mapping[value]
    blank = value is None or (isinstance(value, str) and not value.strip())
    if blank and spec.optional:
        return None
    if blank:
        raise ValueError(f"{spec.label} is empty: enter {accepted(spec)}")
    if spec.kind == "bool":
        if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
            return value.strip().lower() in ("true", "1")
        if isinstance(value, bool) or value in (0, 1):
            return bool(value)
        raise bad()
    if spec.kind == "choice":  # also the string form of a non-string choice (e.g. "64" for 64)
        for c in spec.choices:
            if (value == c and type(value) is type(c)) or (isinstance(value, str) and value.strip() == str(c)):
                return c
        raise bad()
    if isinstance(value, bool) or isinstance(value, (list, dict)):
        raise bad()
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise bad() from None
    if not math.isfinite(x) or (spec.kind == "int" and x != int(x)):
        raise bad()
    x = int(x) if spec.kind == "int" else x
    if (spec.minimum is not None and x < spec.minimum) or (spec.maximum is not None and x > spec.maximum):
        raise bad()
    return x


def overrides(config_cls, preset: str, specs: list[FieldSpec], values: list, form_preset: str | None = None) -> dict:
    """Fields whose submitted value differs from ``form_preset``'s (default: ``preset``'s), i.e. what the
    user edited after the form was filled; raises ``gr.Error`` on a bad value or an unknown preset."""
    preset = normal_preset(preset)
    form_preset = normal_preset(form_preset or preset)
    if len(values) != len(specs):
        raise refuse(f"Expected {len(specs)} advanced settings, got {len(values)}.")
    base = config_cls.preset(form_preset)
    out = {}
    for spec, value in zip(specs, values):
        try:
            v = _coerce(spec, value)
        except (TypeError, ValueError) as e:
            raise refuse(f"Advanced setting: {e}.") from None
        if v != getattr(base, spec.name):
            out[spec.name] = v
    return out


def build_config(config_cls, preset: str, over: dict):
    """``config_cls.preset(preset, **over)``; the engine's own validation errors become ``gr.Error``."""
    try:
        return config_cls.preset(preset, **over)
    except (TypeError, ValueError) as e:
        raise refuse(f"Invalid 6Bit settings: {html.escape(str(e), quote=False)}") from None


def normal_preset(preset) -> str:
    """The preset name a request gave, normalised; ``gr.Error`` naming the choices for anything else."""
    p = preset.strip().lower() if isinstance(preset, str) else None
    if p not in PRESETS:
        raise refuse(f"Unknown 6Bit preset {shown(preset)}: the 6Bit preset must be one of {', '.join(PRESETS)}.")
    return p
