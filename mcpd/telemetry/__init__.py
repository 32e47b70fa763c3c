"""MQTT telemetry: status, events and commands between a board and its fleet's broker."""

from __future__ import annotations

from mcpd.telemetry.service import TelemetryService

__all__ = ["TelemetryService"]
