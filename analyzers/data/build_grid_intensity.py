"""Rebuild ``grid_intensity.csv`` from the reference tables in ``../shared/realdata/energy/``.

Usage: python analyzers/data/build_grid_intensity.py [REALDATA_ENERGY_DIR]

The shipped CSV is derived data (re-tabulated, values unchanged): one row per (country, region), each with
the file and row it came from in ``source``. Licences and notices: ATTRIBUTION.md beside this script.

- Country rows (region ""): ``codecarbon_global_energy_mix.json`` ``carbon_intensity`` per ISO alpha-3 key,
  the newest year there (Our World in Data, "data adapted from Ember, Energy Institute"): one consistent
  lifecycle, generation-based basis for every country.
- Sub-national rows: ``green-algorithms_CI_aggregated.csv`` rows whose location code is ``CC-REGION``
  (US states, Canadian provinces, Australian states, Hong Kong utilities), country mapped alpha-2 → alpha-3
  through ``carbontracker_carbon-intensities.csv``; Nordic bidding zones from ``codecarbon_nordic_emissions.json``.
- World fallback (country ``WLD``): green-algorithms ``WORLD`` row (IEA 2019, 475 g/kWh).
"""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_SRC = HERE.parents[2] / "shared" / "realdata" / "energy"
COLUMNS = ("country", "region", "year", "g_per_kwh", "basis", "source")


def build(src: Path) -> list[dict]:
    rows: list[dict] = []
    a2_to_a3: dict[str, str] = {}
    with open(src / "carbontracker_carbon-intensities.csv", newline="", encoding="utf-8") as f:
        for rec in csv.DictReader(f):
            if rec["alpha-2"] and rec["Code"]:
                a2_to_a3[rec["alpha-2"]] = rec["Code"]

    mix = json.loads((src / "codecarbon_global_energy_mix.json").read_text(encoding="utf-8"))
    for key in sorted(mix):
        v = mix[key]
        rows.append({
            "country": key, "region": "", "year": v["year"], "g_per_kwh": v["carbon_intensity"],
            "basis": "lifecycle gCO2e/kWh of electricity generation (OWID carbon_intensity_elec; Ember, Energy Institute)",
            "source": f'codecarbon_global_energy_mix.json ["{key}"].carbon_intensity',
        })

    with open(src / "green-algorithms_CI_aggregated.csv", newline="", encoding="utf-8") as f:
        lines = list(csv.reader(f))
    header = lines[1]  # line 1 is units, line 2 the column names
    col = {name: i for i, name in enumerate(header)}
    for lineno, rec in enumerate(lines[2:], start=3):
        loc = rec[col["location"]]
        m = re.search(r"data from (\d{4})", rec[col["source"]] + " " + rec[col["comments"]])
        year = int(m.group(1)) if m else ""
        if loc == "WORLD":
            rows.append({
                "country": "WLD", "region": "", "year": 2019, "g_per_kwh": float(rec[col["carbonIntensity"]]),
                "basis": "world average (IEA Global Energy & CO2 Status Report 2019)",
                "source": f"green-algorithms_CI_aggregated.csv line {lineno} (WORLD)",
            })
        elif "-" in loc:
            a2 = loc.split("-", 1)[0]
            rows.append({
                "country": a2_to_a3[a2], "region": loc, "year": year, "g_per_kwh": float(rec[col["carbonIntensity"]]),
                "basis": (rec[col["comments"]] or "grid emission factor") + f"; {rec[col['source']]}",
                "source": f"green-algorithms_CI_aggregated.csv line {lineno} ({loc})",
            })

    nordic = json.loads((src / "codecarbon_nordic_emissions.json").read_text(encoding="utf-8"))
    zone_country = {"SE": "SWE", "NO": "NOR", "FI": "FIN"}
    for zone, v in nordic["data"].items():
        rows.append({
            "country": zone_country[zone[:2]], "region": zone, "year": v["year"], "g_per_kwh": float(v["emission_factor"]),
            "basis": f"bidding zone, {nordic['metadata']['source']}",
            "source": f'codecarbon_nordic_emissions.json data["{zone}"].emission_factor',
        })
    rows.sort(key=lambda r: (r["country"], r["region"]))
    return rows


def write(rows: list[dict], out: Path) -> None:
    with open(out, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_SRC
    write(build(src), HERE / "grid_intensity.csv")
    print(f"wrote {HERE / 'grid_intensity.csv'} from {src}")
