"""International football results, 1872-2026 (martj42/international_results): every men's full international
match with its score, the goalscorers of most matches since 1916, and the penalty shootouts.

The source's four CSV files link only by the natural key (date, home_team, away_team), so the build derives
single-column keys: `match_id` (the row number of the matches ordered by date, home team, away team, then score:
the one key that repeats, 1974-02-17 Tahiti v New Caledonia, is two matches, 2-1 and 1-2, and keeps both),
`team_id` (the 337 team names), `tournament_id` (202 names, each with a derived `kind`), `player_id` (a scorer's
name within the team he played for) and `goal_id`. Goals and shootouts get their match's date, the time they
became known. One shootout (2011-06-29 Saare County v Aland Islands) names no match of the results and is left
out. Everything is written with DuckDB SQL, one thread and `ORDER BY` everywhere, so the bytes are the same on
every run (docs/design/devsuite/intl_football.md).
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from confluence.devsuite import write_table
from confluence.errors import DataError
from confluence.sources.raw import quote_literal

SOURCE = {
    "repo": "martj42/international_results",
    "commit": "65d212aac5deec5157071dcf6e9b05fce0223c84",
    "paths": ("results.csv", "goalscorers.csv", "shootouts.csv", "former_names.csv"),
    "licence": "CC0 1.0 Universal (LICENSE: 'Creative Commons Legal Code / CC0 1.0 Universal')",
    "description": "Men's full international football matches 1872-2026 with scores, goalscorers and shootouts",
}
ROLE = "check"

# the columns of each source file, typed (the files' own header order)
_CSV_COLUMNS = {
    "results": {"date": "DATE", "home_team": "VARCHAR", "away_team": "VARCHAR", "home_score": "INTEGER",
                "away_score": "INTEGER", "tournament": "VARCHAR", "city": "VARCHAR", "country": "VARCHAR",
                "neutral": "BOOLEAN"},
    "goalscorers": {"date": "DATE", "home_team": "VARCHAR", "away_team": "VARCHAR", "team": "VARCHAR",
                    "scorer": "VARCHAR", "minute": "INTEGER", "own_goal": "BOOLEAN", "penalty": "BOOLEAN"},
    "shootouts": {"date": "DATE", "home_team": "VARCHAR", "away_team": "VARCHAR", "winner": "VARCHAR",
                  "first_shooter": "VARCHAR"},
    "former_names": {"current": "VARCHAR", "former": "VARCHAR", "start_date": "DATE", "end_date": "DATE"},
}

# continental championships: the tournaments (and their qualifications) of the six confederations
_CONTINENTAL = ("UEFA Euro", "Copa América", "African Cup of Nations", "AFC Asian Cup", "Gold Cup",
                "CONCACAF Championship", "Oceania Nations Cup")

# setup: the derived key tables (teams, matches by natural key), kept as temporary tables for the outputs below
_SETUP = """
CREATE TEMP TABLE teams AS
  SELECT row_number() OVER (ORDER BY name) AS team_id, name
  FROM (SELECT home_team AS name FROM results UNION SELECT away_team FROM results);
CREATE TEMP TABLE tournaments AS
  SELECT row_number() OVER (ORDER BY name) AS tournament_id, name,
         CASE WHEN name = 'Friendly' THEN 'friendly'
              WHEN name = 'FIFA World Cup' THEN 'world cup'
              WHEN name = 'FIFA World Cup qualification' THEN 'world cup qualification'
              WHEN name IN {continental} THEN 'continental championship'
              WHEN name IN {qualification} THEN 'continental qualification'
              WHEN name LIKE '%Nations League%' THEN 'nations league'
              ELSE 'other tournament' END AS kind
  FROM (SELECT DISTINCT tournament AS name FROM results);
CREATE TEMP TABLE matches AS
  SELECT row_number() OVER (ORDER BY r.date, r.home_team, r.away_team, r.home_score, r.away_score) AS match_id,
         r.date, h.team_id AS home_team_id, a.team_id AS away_team_id, r.home_score, r.away_score,
         t.tournament_id, r.city, r.country, r.neutral, r.home_team, r.away_team
  FROM results r JOIN teams h ON h.name = r.home_team JOIN teams a ON a.name = r.away_team
  JOIN tournaments t ON t.name = r.tournament;
-- a natural key names one match (the first of a repeated key), so a child row is never doubled
CREATE TEMP TABLE match_keys AS
  SELECT date, home_team, away_team, min(match_id) AS match_id FROM matches GROUP BY ALL;
CREATE TEMP TABLE goal_rows AS
  SELECT k.match_id, g.date, t.team_id,
         CASE WHEN g.own_goal THEN (CASE WHEN g.team = g.home_team THEN g.away_team ELSE g.home_team END)
              ELSE g.team END AS player_team, g.scorer, g.minute, g.own_goal, g.penalty
  FROM goalscorers g JOIN match_keys k USING (date, home_team, away_team) JOIN teams t ON t.name = g.team;
CREATE TEMP TABLE players AS
  SELECT row_number() OVER (ORDER BY p.player_team, p.scorer) AS player_id, t.team_id, p.scorer AS name,
         p.first_goal_date, p.player_team
  FROM (SELECT player_team, scorer, min(date) AS first_goal_date FROM goal_rows WHERE scorer IS NOT NULL
        GROUP BY ALL) p JOIN teams t ON t.name = p.player_team;
"""

# the output tables, one Parquet file each
_TABLES = {
    "teams": "SELECT team_id, name FROM teams ORDER BY team_id",
    "tournaments": "SELECT tournament_id, name, kind FROM tournaments ORDER BY tournament_id",
    "matches": (
        "SELECT match_id, date, home_team_id, away_team_id, home_score, away_score, tournament_id, city, country,"
        " neutral FROM matches ORDER BY match_id"
    ),
    "players": "SELECT player_id, team_id, name, first_goal_date FROM players ORDER BY player_id",
    "goals": (
        "SELECT row_number() OVER (ORDER BY g.match_id, g.minute NULLS LAST, g.team_id, g.player_team, g.scorer,"
        " g.own_goal, g.penalty) AS goal_id, g.match_id, g.date, g.team_id, p.player_id, g.minute, g.own_goal,"
        " g.penalty FROM goal_rows g LEFT JOIN players p ON p.player_team = g.player_team AND p.name = g.scorer"
        " ORDER BY goal_id"
    ),
    "shootouts": (
        "SELECT row_number() OVER (ORDER BY k.match_id) AS shootout_id, k.match_id, s.date,"
        " w.team_id AS winner_team_id, f.team_id AS first_shooter_team_id"
        " FROM shootouts s JOIN match_keys k USING (date, home_team, away_team)"
        " JOIN teams w ON w.name = s.winner LEFT JOIN teams f ON f.name = s.first_shooter ORDER BY shootout_id"
    ),
    "former_names": (
        "SELECT row_number() OVER (ORDER BY t.team_id, f.start_date, f.former) AS former_name_id, t.team_id,"
        " f.former AS former_name, f.start_date, f.end_date"
        " FROM former_names f JOIN teams t ON t.name = f.current ORDER BY former_name_id"
    ),
}


def _read_csv(path: Path, columns: dict[str, str]) -> str:
    """DuckDB's reader of one source CSV with fixed column types; 'NA' (goalscorers' minute, scorer) is NULL."""
    if not path.is_file():
        raise DataError(f"{path}: missing from the international_results source")
    types = ", ".join(f"{quote_literal(name)}: {quote_literal(sql)}" for name, sql in columns.items())
    return (f"read_csv({quote_literal(str(path))}, header = true, columns = {{{types}}}, nullstr = 'NA',"
            " dateformat = '%Y-%m-%d')")


def _sql_list(names) -> str:
    """A SQL list of string literals, `('a', 'b')`."""
    return "(" + ", ".join(quote_literal(n) for n in names) + ")"


def build(source: Path, out: Path) -> Path:
    """Read the source's CSV files (a checkout of the repository) and write the seven tables as Parquet files
    into `out`; returns `out`."""
    source, out = Path(source), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(":memory:")
    try:
        con.execute("SET threads = 1")  # one thread: the same row order and bytes on every run
        for name, columns in _CSV_COLUMNS.items():
            con.execute(f"CREATE TEMP TABLE {name} AS SELECT * FROM {_read_csv(source / f'{name}.csv', columns)}")
        con.execute(_SETUP.format(continental=_sql_list(_CONTINENTAL),
                                  qualification=_sql_list(f"{n} qualification" for n in _CONTINENTAL)))
        for table, query in _TABLES.items():
            write_table(con, query, out, table)
    except duckdb.Error as exc:
        raise DataError(f"{source}: building intl_football failed: {exc}") from None
    finally:
        con.close()
    return out
