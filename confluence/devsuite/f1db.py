"""F1DB, the Formula 1 database (f1db/f1db), as one Parquet file per table.

The source is a tree of YAML files (`src/data/`): one file per driver, constructor, circuit, country, ...; one
folder per race (`seasons/<year>/races/<nn-name>/`) holding `race.yml` and one list file per session result. They
are read with PyYAML's base loader, so every scalar arrives as text and is typed here (YAML 1.1 would otherwise
turn the country code `NO` into false and an unquoted `13:00` into the integer 780).

What the build makes of it (docs/design/devsuite/f1db.md):
- one table per kind of result (race_results, qualifying, driver_standings, pit_stops, fastest_laps), each row
  carrying its race's `race_date`: a child table needs the time of its event, or a prediction made before a race
  would see that race's results;
- `race_results.result_id`, a surrogate key (race_id * 1000 + place in the classification), so that tasks can
  anchor on a result;
- a result's `position` is split into a number (NULL when not classified) and `status` (FINISHED, DNF, DNS, DNQ,
  DNPQ, NC, DSQ, EX, DNP); `gridPosition` "PL" becomes `pit_lane_start`; times ("1:27:38.241") become
  milliseconds and gaps ("+5.384", "+2 laps") `gap_ms` or `gap_laps`;
- `races` keeps what is known before the race (scheduled laps and distance, not those run, no championship
  deciders); starting grids, sprints, practice sessions, entrants, chassis and engines are left out (the grid is
  `race_results.grid_position`; the others are sessions or season lists the tasks do not need).
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from confluence.errors import DataError

SOURCE = {
    "repo": "f1db/f1db",
    "commit": "6a5845b840e68d53400f3e8db97b55c3ad2fab52",
    "files": ["src/data/"],
    "licence": (
        "Creative Commons Attribution 4.0 International (LICENSE of the repository: 'Attribution 4.0 "
        "International'); the README: 'F1DB is licensed under a Creative Commons Attribution 4.0 International "
        "License.' Attribution: F1DB, https://github.com/f1db/f1db"
    ),
    "description": "Formula 1 from 1950 to July 2026: 1,172 races (1,160 run), 27,533 race results of 917 drivers "
                   "and 187 constructors, with qualifying, standings, pit stops and fastest laps.",
}
ROLE = "tune"

_LOADER = getattr(yaml, "CBaseLoader", yaml.BaseLoader)  # every scalar as a string; the C loader when built


def _load(path: Path):
    """The YAML document of `path`, every scalar a string ('' for an empty value)."""
    with open(path, encoding="utf-8") as f:
        return yaml.load(f, Loader=_LOADER)  # noqa: S506 - the base loader builds only str, list and dict


def _text(v) -> str | None:
    return v if isinstance(v, str) and v != "" else None


def _int(v) -> int | None:
    return int(v) if isinstance(v, str) and re.fullmatch(r"-?\d+", v) else None


def _float(v) -> float | None:
    return float(v) if isinstance(v, str) and re.fullmatch(r"-?\d+(\.\d+)?", v) else None


def _date(v) -> dt.date | None:
    return dt.date.fromisoformat(v) if _text(v) else None


def _ms(v) -> int | None:
    """Milliseconds of a time written 'h:mm:ss.sss', 'm:ss.sss' or 'ss.sss' (a leading '+' allowed)."""
    m = re.fullmatch(r"\+?(?:(?:(\d+):)?(\d+):)?(\d+(?:\.\d+)?)", v or "")
    if not m:
        return None
    h, mnt, s = m.groups()
    return round(((int(h or 0) * 60 + int(mnt or 0)) * 60 + float(s)) * 1000)


def _gap_laps(v) -> int | None:
    m = re.fullmatch(r"\+(\d+) laps?", v or "")
    return int(m.group(1)) if m else None


def _bool(v) -> bool:
    return v == "true"


# table -> [(column, Arrow type, value of a YAML record)], in column order; the first column is the sort key
_ENTITIES = {
    "countries": ("countries", [
        ("country_id", pa.string(), lambda r: r["id"]),
        ("name", pa.string(), lambda r: r["name"]),
        ("continent", pa.string(), lambda r: r["continentId"]),
    ]),
    "drivers": ("drivers", [
        ("driver_id", pa.string(), lambda r: r["id"]),
        ("name", pa.string(), lambda r: r["name"]),
        ("gender", pa.string(), lambda r: r["gender"]),
        ("date_of_birth", pa.date32(), lambda r: _date(r["dateOfBirth"])),
        ("date_of_death", pa.date32(), lambda r: _date(r.get("dateOfDeath"))),
        ("country_of_birth_id", pa.string(), lambda r: _text(r["countryOfBirthCountryId"])),
        ("nationality_id", pa.string(), lambda r: _text(r["nationalityCountryId"])),
    ]),
    "constructors": ("constructors", [
        ("constructor_id", pa.string(), lambda r: r["id"]),
        ("name", pa.string(), lambda r: r["name"]),
        ("country_id", pa.string(), lambda r: _text(r["countryId"])),
    ]),
    "engine_manufacturers": ("engine-manufacturers", [
        ("engine_manufacturer_id", pa.string(), lambda r: r["id"]),
        ("name", pa.string(), lambda r: r["name"]),
        ("country_id", pa.string(), lambda r: _text(r["countryId"])),
    ]),
    "circuits": ("circuits", [
        ("circuit_id", pa.string(), lambda r: r["id"]),
        ("name", pa.string(), lambda r: r["fullName"]),
        ("type", pa.string(), lambda r: r["type"]),
        ("direction", pa.string(), lambda r: r["direction"]),
        ("country_id", pa.string(), lambda r: _text(r["countryId"])),
        ("latitude", pa.float64(), lambda r: _float(r["latitude"])),
        ("longitude", pa.float64(), lambda r: _float(r["longitude"])),
        ("length_km", pa.float64(), lambda r: _float(r["length"])),
        ("turns", pa.int32(), lambda r: _int(r["turns"])),
    ]),
    "grands_prix": ("grands-prix", [
        ("grand_prix_id", pa.string(), lambda r: r["id"]),
        ("name", pa.string(), lambda r: r["fullName"]),
        ("country_id", pa.string(), lambda r: _text(r.get("countryId"))),
    ]),
}

_RACE = [
    ("race_id", pa.int32(), lambda r: _int(r["id"])),
    ("race_date", pa.date32(), lambda r: _date(r["date"])),
    ("round", pa.int32(), lambda r: _int(r["round"])),
    ("grand_prix_id", pa.string(), lambda r: r["grandPrixId"]),
    ("circuit_id", pa.string(), lambda r: r["circuitId"]),
    ("qualifying_format", pa.string(), lambda r: r["qualifyingFormat"]),
    ("course_length_km", pa.float64(), lambda r: _float(r["courseLength"])),
    ("turns", pa.int32(), lambda r: _int(r["turns"])),
    # a shortened race records the laps run in `laps` and the plan in `scheduledLaps`
    ("scheduled_laps", pa.int32(), lambda r: _int(r.get("scheduledLaps") or r["laps"])),
    ("scheduled_distance_km", pa.float64(), lambda r: _float(r.get("scheduledDistance") or r["distance"])),
    ("sprint_weekend", pa.bool_(), lambda r: "sprintRaceLaps" in r),
]

_RESULT_CODES = ("DNF", "DNS", "DNQ", "DNPQ", "NC", "DSQ", "EX", "DNP")

# the columns every per-race table starts with: (column, type, value of (race, index in the file, record))
_PER_RACE = [
    ("race_id", pa.int32(), lambda race, i, r: race["race_id"]),
    ("race_date", pa.date32(), lambda race, i, r: race["race_date"]),
    ("driver_id", pa.string(), lambda race, i, r: r["driverId"]),
]
_CAR = [("constructor_id", pa.string(), lambda race, i, r: r["constructorId"])]

# table -> (file in the race folder, its columns after the shared ones)
_RESULTS = {
    "race_results": ("race-results.yml", [
        ("result_id", pa.int64(), lambda race, i, r: race["race_id"] * 1000 + i + 1),
        *_PER_RACE, *_CAR,
        ("engine_manufacturer_id", pa.string(), lambda race, i, r: r["engineManufacturerId"]),
        ("tyre_manufacturer", pa.string(), lambda race, i, r: _text(r.get("tyreManufacturerId"))),
        ("driver_number", pa.int32(), lambda race, i, r: _int(r.get("driverNumber"))),
        ("grid_position", pa.int32(), lambda race, i, r: _int(r.get("gridPosition"))),
        ("pit_lane_start", pa.bool_(), lambda race, i, r: r.get("gridPosition") == "PL"),
        ("status", pa.string(), lambda race, i, r: "FINISHED" if _int(r["position"]) else r["position"]),
        ("position", pa.int32(), lambda race, i, r: _int(r["position"])),
        ("laps", pa.int32(), lambda race, i, r: _int(r.get("laps"))),
        ("time_ms", pa.int64(), lambda race, i, r: _ms(r.get("time"))),
        ("gap_ms", pa.int64(), lambda race, i, r: _ms(r.get("gap"))),
        ("gap_laps", pa.int32(), lambda race, i, r: _gap_laps(r.get("gap"))),
        ("time_penalty_ms", pa.int64(), lambda race, i, r: _ms(r.get("timePenalty"))),
        ("reason_retired", pa.string(), lambda race, i, r: _text(r.get("reasonRetired"))),
        ("points", pa.float64(), lambda race, i, r: _float(r.get("points")) or 0.0),  # empty: none scored
        ("shared_car", pa.bool_(), lambda race, i, r: _bool(r.get("sharedCar"))),
    ]),
    "qualifying": ("qualifying-results.yml", [
        *_PER_RACE, *_CAR,
        ("position", pa.int32(), lambda race, i, r: _int(r["position"])),
        ("time_ms", pa.int64(), lambda race, i, r: _ms(r.get("time"))),
        ("q1_ms", pa.int64(), lambda race, i, r: _ms(r.get("q1"))),
        ("q2_ms", pa.int64(), lambda race, i, r: _ms(r.get("q2"))),
        ("q3_ms", pa.int64(), lambda race, i, r: _ms(r.get("q3"))),
        ("laps", pa.int32(), lambda race, i, r: _int(r.get("laps"))),
    ]),
    "driver_standings": ("driver-standings.yml", [
        *_PER_RACE,
        ("position", pa.int32(), lambda race, i, r: _int(r["position"])),
        ("points", pa.float64(), lambda race, i, r: _float(r["points"])),
    ]),
    "pit_stops": ("pit-stops.yml", [
        *_PER_RACE, *_CAR,
        ("stop", pa.int32(), lambda race, i, r: _int(r["stop"])),
        ("lap", pa.int32(), lambda race, i, r: _int(r["lap"])),
        ("duration_ms", pa.int64(), lambda race, i, r: _ms(r.get("time"))),
    ]),
    "fastest_laps": ("fastest-laps.yml", [
        *_PER_RACE, *_CAR,
        ("position", pa.int32(), lambda race, i, r: _int(r["position"])),
        ("lap", pa.int32(), lambda race, i, r: _int(r.get("lap"))),
        ("time_ms", pa.int64(), lambda race, i, r: _ms(r.get("time"))),
    ]),
}


def _table(columns, rows: list[tuple], sort: list[str]) -> pa.Table:
    """An Arrow table of fixed column types from value tuples, sorted by `sort` (a trailing `_i` column, the
    row's place in its file, sorts and is dropped)."""
    names = [c[0] for c in columns] + (["_i"] if "_i" in sort else [])
    types = [c[1] for c in columns] + ([pa.int32()] if "_i" in sort else [])
    data = pa.table([pa.array([r[k] for r in rows], t) for k, t in enumerate(types)], names=names)
    data = data.sort_by([(c, "ascending") for c in sort])
    return data.drop_columns(["_i"]) if "_i" in sort else data


def build(source: Path, out: Path) -> Path:
    """Write the F1DB tables as Parquet files into `out` from a checkout of f1db/f1db (its `src/data/`); returns
    `out`."""
    data = Path(source) / "src" / "data"
    if not (data / "seasons").is_dir():
        raise DataError(f"{data}: no seasons/ folder (a checkout of {SOURCE['repo']} at {SOURCE['commit'][:8]}?)")
    tables: dict[str, pa.Table] = {}
    for table, (folder, cols) in _ENTITIES.items():
        records = [_load(p) for p in sorted((data / folder).glob("*.yml"))]
        tables[table] = _table(cols, [tuple(f(r) for _, _, f in cols) for r in records], [cols[0][0]])

    races, rows = [], {t: [] for t in _RESULTS}
    for race_dir in sorted(data.glob("seasons/*/races/*/")):
        raw = _load(race_dir / "race.yml")
        race = {name: f(raw) for name, _, f in _RACE}
        races.append(tuple(race.values()))
        for table, (file, cols) in _RESULTS.items():
            path = race_dir / file
            for i, r in enumerate((_load(path) or []) if path.is_file() else []):
                if table == "race_results" and not (_int(r["position"]) or r["position"] in _RESULT_CODES):
                    raise DataError(f"{path}: entry {i + 1}: unknown position {r['position']!r}")
                rows[table].append(tuple(f(race, i, r) for _, _, f in cols) + (i,))
    tables["races"] = _table(_RACE, races, ["race_id"])
    for table, (_, cols) in _RESULTS.items():
        tables[table] = _table(cols, rows[table], ["race_id", "_i"])  # by race, then in the file's order

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for table, t in sorted(tables.items()):
        pq.write_table(t, out / f"{table}.parquet", compression="zstd")
    return out
