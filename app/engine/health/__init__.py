"""The engine's health and the operator's record of it: endpoint and store health, the serialised writer, the
heartbeat, the run lock, and the event log."""
