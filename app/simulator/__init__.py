"""OpenAI/OpenRouter-compatible provider simulator on loopback: replays reference ids as text, injects faults."""

from app.simulator.options import FAULT_KINDS, KEEPALIVE, QUIRKS, SimulatorOptions
from app.simulator.server import SimulatorServer

__all__ = ["FAULT_KINDS", "KEEPALIVE", "QUIRKS", "SimulatorOptions", "SimulatorServer"]
