"""A board's series in a time-series store as `mcpctl ingest` writes them: the board's /metrics
families that `mcpctl fleet --from` queries (mcpd/ctl/fleet_store.py), labelled by instance (the device id, as `mcpctl ingest` labels them), in the
Prometheus text format with millisecond timestamps (VictoriaMetrics' /api/v1/import/prometheus).
For tests/ctl/test_fleet_store.py and bench/fleet_view.py."""

from __future__ import annotations


def board_series(
    device: str, at: float, celsius: float, requests: tuple[int, int], drift: float = 1.0
) -> str:
    """Its last sample at `at` (Unix time); the request counter also 10 s before, for a rate;
    its cooling `degraded` from a `drift` of 1.25 up, else `normal`."""
    ms = round(at * 1000)
    earlier = ms - 10_000
    states = "".join(
        f'mcpd_governor_state{{instance="{device}",state="{state}"}} {int(state == "lowering")} {ms}\n'
        for state in ("holding", "lowering", "raising")
    )
    cooling = "degraded" if drift >= 1.25 else "normal"
    states += "".join(
        f'mcpd_cooling_state{{instance="{device}",state="{state}"}} {int(state == cooling)} {ms}\n'
        for state in ("normal", "degraded")
    )
    return (
        f'mcpd_cooling_drift_ratio{{instance="{device}"}} {drift} {ms}\n'
        f'mcpd_temperature_celsius{{instance="{device}"}} {celsius} {ms}\n'
        f'mcpd_power_watts{{instance="{device}",estimated="false"}} 9.5 {ms}\n'
        f'mcpd_domain_cap_hertz{{instance="{device}",domain="policy0",kind="cpufreq"}} 1200000000 {ms}\n'
        f'mcpd_domain_cap_hertz{{instance="{device}",domain="fb000000.gpu",kind="devfreq"}} 600000000 {ms}\n'
        f'mcpd_board_info{{instance="{device}",platform="rk3588",model="Radxa ROCK 5B"}} 1 {ms}\n'
        f'mcpd_inference_requests_total{{instance="{device}",model="m"}} {requests[0]} {earlier}\n'
        f'mcpd_inference_requests_total{{instance="{device}",model="m"}} {requests[1]} {ms}\n'
        f"{states}"
    )
