"""The gate: one path policy and one confinement for everything that acts for the model."""

from bot.gate.gate import (
    Confinement,
    Gate,
    GateProcess,
    GateRefused,
    ProcessScope,
    describe_confinement,
    install_roots,
    installation_id,
    reap_leftovers,
    remove_stale_temp,
)
from bot.gate.policy import PathPolicy, real_path

__all__ = [
    "Confinement",
    "Gate",
    "GateProcess",
    "GateRefused",
    "PathPolicy",
    "ProcessScope",
    "describe_confinement",
    "install_roots",
    "installation_id",
    "real_path",
    "reap_leftovers",
    "remove_stale_temp",
]
