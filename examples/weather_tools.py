"""A small typed toolbox: weather tools a cell can call as `tools.<name>(...)`.

Each tool is a Python function with type hints and a docstring; `codemode.Toolbox` turns the
signature into the JSON Schema the model reads (as a TypeScript declaration) and checks the
cell's arguments against it. The data is made up, so the examples run offline.

Try it:

    .venv/bin/codemode describe --tools examples.weather_tools:toolbox
    .venv/bin/codemode run examples/weather.js --tools examples.weather_tools:toolbox
"""

from __future__ import annotations

import enum
from typing import Annotated

import msgspec
import trio

import codemode

toolbox = codemode.Toolbox()


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Reading(msgspec.Struct, frozen=True, kw_only=True):
    """A temperature reading."""

    city: str
    degrees: float
    unit: Unit


class DayForecast(msgspec.Struct, frozen=True, kw_only=True):
    """The forecast of one day."""

    day: int
    low: float
    high: float
    sky: str


_CELSIUS = {"Lima": 19.0, "Oslo": -2.0, "Paris": 11.0}
_SKIES = ["sunny", "cloudy", "rain", "snow"]


def _convert(celsius: float, unit: Unit) -> float:
    return celsius if unit is Unit.CELSIUS else round(celsius * 9 / 5 + 32, 1)


def _known(city: str) -> float:
    if city not in _CELSIUS:
        raise codemode.ToolError(f"unknown city: {city} (try one of {', '.join(_CELSIUS)})")
    return _CELSIUS[city]


@toolbox.tool
def list_cities() -> list[str]:
    """The cities these tools know."""
    return sorted(_CELSIUS)


@toolbox.tool
def current_temperature(city: str, unit: Unit = Unit.CELSIUS) -> Reading:
    """The temperature in a city right now.

    A plain function: codemode runs it in a worker thread, where a blocking call (an HTTP
    request, say) does not hold up other cells.
    """
    return Reading(city=city, degrees=_convert(_known(city), unit), unit=unit)


@toolbox.tool
async def forecast(
    city: str,
    days: Annotated[int, msgspec.Meta(ge=1, le=7, description="How many days, 1 to 7.")] = 3,
) -> list[DayForecast]:
    """The forecast of a city for the next days."""
    celsius = _known(city)
    await trio.lowlevel.checkpoint()  # an async tool runs in the provider's trio loop
    return [
        DayForecast(
            day=day,
            low=celsius - 4 + day,
            high=celsius + 3 + day,
            sky=_SKIES[(len(city) + day) % len(_SKIES)],
        )
        for day in range(1, days + 1)
    ]
