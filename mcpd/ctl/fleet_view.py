"""The fleet table: what the broker (and the store) said about each board, and its lines.

Pure: topics, payloads and the time in, rows out. Online is what the board last said (`online`, or
`offline` from its Will or its clean stop) and heard from within 3 x heartbeat_s: a board whose
broker node died with it sends no Will, and with MQTT 3.1.1 its retained `online` never expires
(mcpd/telemetry/liveness.py). Without its statuses (`mcpctl fleet --from` alone), a board is online
while it has been heard from within that time.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

from mcpd.config import MqttSection
from mcpd.telemetry.liveness import EXPIRY_HEARTBEATS

Telemetry = dict[str, Any]
"""A telemetry message's body, or the part of one a store gives back (fleet_store)."""


@dataclass(frozen=True)
class Row:
    device: str
    online: bool | None
    """None: no status seen (a board that never connected with mcpd's status topic). False also
    when the board said `online` but has not been heard from for 3 x heartbeat_s."""
    platform: str | None
    temperature_c: float | None
    power_w: float | None
    caps_mhz: dict[str, float | None]
    governor: str | None
    cooling: str | None
    """The cooling's state (README, "Cooling health"); None from a board that does not say."""
    drift_ratio: float | None
    """Its thermal resistance over its baseline."""
    requests_per_s: float | None
    last_seen_s: float | None
    """Seconds since its last telemetry; None if none seen yet."""
    site: str | None = None
    """The topic level between the prefix and the device, with --site; else None."""


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class FleetView:
    """What the broker (and the store) said about each board. Updated from paho's thread, read
    from ours. `now` is Unix time, as the store's sample times are."""

    def __init__(
        self,
        prefix: str,
        sites: tuple[str, ...] = (),
        heartbeat_s: float = MqttSection.heartbeat_s,
        statuses: bool = True,
    ) -> None:
        self.prefix = prefix
        self.sites = sites
        """Boards live under `<prefix>/<site>/<id>`: these sites ("+": every one); () for
        `<prefix>/<id>`."""
        self.heartbeat_s = heartbeat_s
        self.statuses = statuses
        """Whether the boards' statuses are followed; without, online is heard-from alone."""
        self._said: dict[str, bool] = {}
        self._heard: dict[str, float] = {}
        self._site: dict[str, str] = {}
        self._telemetry: dict[str, tuple[float, Telemetry]] = {}
        self._lock = threading.Lock()

    def bases(self) -> list[str]:
        """The topic filters of the boards' `<base>/<id>/…`."""
        return [f"{self.prefix}/{site}" for site in self.sites] or [self.prefix]

    def _where(self, topic: str) -> tuple[str | None, str, str] | None:
        """(site, device, leaf) of one of our boards' topics."""
        if not topic.startswith(self.prefix + "/"):
            return None
        levels = topic[len(self.prefix) + 1 :].split("/")
        if not self.sites:
            return (None, levels[0], levels[1]) if len(levels) == 2 and levels[0] else None
        if len(levels) != 3 or not levels[1] or not {levels[0], "+"} & set(self.sites):
            return None
        return levels[0], levels[1], levels[2]

    def update(self, topic: str, payload: bytes, now: float) -> None:
        where = self._where(topic)
        if where is None:
            return
        site, device, leaf = where
        if leaf == "status" and payload in (b"online", b"offline"):
            with self._lock:
                self._said[device] = payload == b"online"
                self._heard[device] = now
                self._site[device] = site or ""
        elif leaf == "telemetry":
            try:
                body = json.loads(payload)
            except ValueError:
                return  # not mcpd's; keep the last good one
            if isinstance(body, dict):
                self.measured(device, now, body, site)

    def measured(self, device: str, at: float, body: Telemetry, site: str | None = None) -> None:
        """A board's numbers as of `at`, from its telemetry or from the store."""
        with self._lock:
            self._telemetry[device] = (at, body)
            self._heard[device] = max(at, self._heard.get(device, at))
            if site is not None:
                self._site[device] = site

    def rows(self, now: float, sort: str = "temperature") -> list[Row]:
        """Hottest first; by `sort="drift"`, the worst cooling first, then hottest. A board
        without the figure comes after those with it."""
        with self._lock:
            devices = sorted(self._said.keys() | self._telemetry.keys())
            if self.sites and self.statuses:  # the store knows no sites: only boards heard here
                devices = [d for d in devices if d in self._site]
            rows = [self._row(device, now) for device in devices]
        rows.sort(key=lambda r: (r.temperature_c is None, -(r.temperature_c or 0)))
        if sort == "drift":
            rows.sort(key=lambda r: (r.drift_ratio is None, -(r.drift_ratio or 0)))
        return rows

    def _online(self, device: str, now: float) -> bool | None:
        heard = self._heard.get(device)
        fresh = heard is not None and now - heard <= EXPIRY_HEARTBEATS * self.heartbeat_s
        if not self.statuses:
            return None if heard is None else fresh
        said = self._said.get(device)
        return None if said is None else said and fresh

    def _row(self, device: str, now: float) -> Row:
        seen, body = self._telemetry.get(device, (None, {}))
        domains = body.get("domains")
        governor = body.get("governor")
        cooling = body.get("cooling")
        if not isinstance(cooling, dict):
            cooling = {}
        return Row(
            device=device,
            online=self._online(device, now),
            platform=body.get("platform") if isinstance(body.get("platform"), str) else None,
            temperature_c=_number(body.get("temperature_c")),
            power_w=_number(body.get("power_w")),
            caps_mhz={
                str(name): _number(d.get("cap_mhz")) if isinstance(d, dict) else None
                for name, d in (domains.items() if isinstance(domains, dict) else ())
            },
            governor=str(governor.get("state")) if isinstance(governor, dict) else None,
            cooling=str(cooling["state"]) if "state" in cooling else None,
            drift_ratio=_number(cooling.get("drift_ratio")),
            requests_per_s=_number(body.get("requests_per_s")),
            last_seen_s=None if seen is None else round(now - seen, 1),
            site=self._site.get(device) or None,
        )


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(rows: list[Row]) -> str:
    header = (
        "DEVICE",
        "ONLINE",
        "PLATFORM",
        "TEMP °C",
        "POWER W",
        "CAPS MHz",
        "GOVERNOR",
        "COOLING",
        "REQ/S",
        "LAST SEEN",
    )
    lines = [header]
    for row in rows:
        caps = " ".join(
            f"{name.rsplit('.', 1)[-1]} {_fmt(cap, '.0f')}" for name, cap in row.caps_mhz.items()
        )
        online = {True: "yes", False: "NO", None: "?"}[row.online]
        lines.append(
            (
                f"{row.site}/{row.device}" if row.site else row.device,
                online,
                row.platform or "-",
                _fmt(row.temperature_c, ".1f"),
                _fmt(row.power_w, ".2f"),
                caps or "-",
                row.governor or "-",
                " x".join(
                    (row.cooling or "-", *([f"{row.drift_ratio:.2f}"] if row.drift_ratio else []))
                ),
                _fmt(row.requests_per_s, ".1f"),
                "-" if row.last_seen_s is None else f"{row.last_seen_s:.1f} s",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    right = {3, 4, 8, 9}
    return "\n".join(
        "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(line, widths, strict=True))
        ).rstrip()
        for line in lines
    )
