"""Training frameworks (``framework:``): what each framework's own launcher would export.

Filled in by the frameworks work of issue 22.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    from orchestrator.payload import Payload


def environment(payload: Payload, contract: Mapping[str, str]) -> dict[str, str]:
    """The variables the framework's launcher would set for a rank whose torchrun contract
    (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR...) is ``contract`` (none without ``framework``)."""
    return {}
