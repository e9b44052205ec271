"""The typed job spec and everything that reads a user's file (docs/ARCHITECTURE.md, side `spec`):
the models (``models``: what a user writes in YAML, every field and every cross-field check),
their rules (``validators``, ``spec_data``), ``--set`` and YAML (``loading``, ``yaml_text``), the
run's identity, ``after:``.

``from orchestrator.spec import JobSpec`` works as it always did: the models' names are read
from ``models`` when first asked for, so that importing a light module of this package
(``yaml_text`` for ``orchestrator list``) does not import pydantic with the models.
"""

from __future__ import annotations

import importlib
import os
from typing import Any


def __getattr__(name: str) -> Any:
    if name.startswith("__") or os.path.exists(os.path.join(os.path.dirname(__file__), name + ".py")):
        raise AttributeError(name)  # a module of this package: the import system imports it
    models = importlib.import_module("orchestrator.spec.models")
    value = getattr(models, name)  # AttributeError names the model module: nothing by that name
    globals()[name] = value
    return value
