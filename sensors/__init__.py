"""Read-only sysfs sensor adapters: thermal zones, hwmon (incl. INA3221), Jetson iio, RAPL."""

from sensors.base import PowerReading, TemperatureReading
from sensors.discovery import PowerSample, SensorSet, TemperatureSample

__all__ = ["PowerReading", "PowerSample", "SensorSet", "TemperatureReading", "TemperatureSample"]
