#!/usr/bin/env python3
"""Checks that every metric the dashboard and the Prometheus rules use exists.

    check_dashboard.py DASHBOARD.json METRICS.txt [RULES.yml ...]

Extracts every metric name referenced in every panel query (and template variable query)
of DASHBOARD.json and in every expression of the rule files (default: the *.rules.yml
files beside METRICS.txt under prometheus/), and fails unless each one is
  - a recording rule (whose own expression is checked the same way, so dashboard names
    resolve down to exported metrics), or
  - an exported metric family listed in METRICS.txt (one name per line; `#` comments and
    blank lines ignored), where a histogram family `x` also covers x_bucket, x_sum and
    x_count, or
  - a series Prometheus itself synthesizes (`up`, scrape_*, ALERTS).
Also checks that every panel and query uses the ${DS_PROMETHEUS} datasource, that panel
ids are unique, and that `job` matchers name one of the two scrape jobs.
Exits 1 on any failure, listing each with where it was found. Needs PyYAML.
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys

import yaml

JOBS = {"tandem-verifier", "tandem-drafter"}
BUILTIN = {"up", "scrape_duration_seconds", "scrape_samples_scraped",
           "scrape_samples_post_metric_relabeling", "scrape_series_added", "ALERTS",
           "ALERTS_FOR_STATE"}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
    "unless", "offset", "inf", "nan", "atan2",
}
IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (a lexer-level approximation)."""
    names: set[str] = set()
    # {__name__="x"} selectors.
    names.update(re.findall(r'__name__\s*=\s*"([A-Za-z_:][A-Za-z0-9_:]*)"', expr))
    s = expr
    s = re.sub(r"#[^\n]*", " ", s)                       # comments
    s = re.sub(r'"(?:\\.|[^"\\])*"', '""', s)            # strings
    s = re.sub(r"'(?:\\.|[^'\\])*'", "''", s)
    s = re.sub(r"`[^`]*`", "``", s)
    s = re.sub(r"\{[^{}]*\}", " ", s)                    # label matchers
    s = re.sub(r"\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*", " ", s)  # Grafana variables
    s = re.sub(r"\[[^\]]*\]", " ", s)                    # ranges / subqueries
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    s = re.sub(r"\boffset\s+-?[0-9a-z]+", " ", s)
    s = re.sub(r"(?<![A-Za-z0-9_:.])[0-9][0-9a-zA-Z_.]*", " ", s)  # numbers, durations
    for m in IDENT.finditer(s):
        word = m.group(0)
        rest = s[m.end():].lstrip()
        if rest.startswith("("):                         # function or aggregation
            continue
        if word.lower() in KEYWORDS:
            continue
        names.add(word)
    return names


def job_values(expr: str) -> set[str]:
    return set(re.findall(r'\bjob\s*=~?\s*"([^"]*)"', expr))


def load_metrics(path: str) -> set[str]:
    out = set()
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                out.add(line)
    return out


def dashboard_queries(dash: dict) -> list[tuple[str, str, dict]]:
    """(where, expr, panel) for every query of every panel, rows' nested panels included."""
    out = []

    def walk(panels):
        for p in panels or []:
            for t in p.get("targets") or []:
                if t.get("expr"):
                    out.append((f"panel {p.get('id')} {p.get('title')!r} ref {t.get('refId')}",
                                t["expr"], p))
            walk(p.get("panels"))

    walk(dash.get("panels"))
    for v in (dash.get("templating") or {}).get("list") or []:
        if v.get("type") == "query":
            q = v.get("query")
            q = q.get("query") if isinstance(q, dict) else q
            if q:
                m = re.match(r"\s*label_values\((.*)\)\s*$", q)
                if m:
                    q = m.group(1).rsplit(",", 1)[0] if "," in m.group(1) else ""
                if q:
                    out.append((f"variable {v.get('name')}", q, {}))
    return out


def all_panels(dash: dict):
    def walk(panels):
        for p in panels or []:
            yield p
            yield from walk(p.get("panels"))
    yield from walk(dash.get("panels"))


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    dash_path, metrics_path = argv[1], argv[2]
    rule_files = argv[3:] or sorted(glob.glob(
        os.path.join(os.path.dirname(metrics_path), "prometheus", "*.rules.yml")))
    exported = load_metrics(metrics_path)
    errors: list[str] = []

    recording: dict[str, str] = {}
    exprs: list[tuple[str, str]] = []
    for rf in rule_files:
        with open(rf, encoding="utf-8") as f:
            doc = yaml.safe_load(f) or {}
        for g in doc.get("groups") or []:
            for r in g.get("rules") or []:
                if "record" in r:
                    if r["record"] in recording:
                        errors.append(f"{rf}: recording rule {r['record']} defined twice")
                    recording[r["record"]] = r["expr"]
                    exprs.append((f"{rf}: record {r['record']}", r["expr"]))
                else:
                    exprs.append((f"{rf}: alert {r.get('alert')}", r["expr"]))

    with open(dash_path, encoding="utf-8") as f:
        dash = json.load(f)
    queries = dashboard_queries(dash)
    if not queries:
        errors.append(f"{dash_path}: no panel queries found")
    exprs += [(f"{dash_path}: {w}", e) for w, e, _ in queries]

    def known(name: str) -> bool:
        if name in recording or name in exported or name in BUILTIN:
            return True
        for suf in HISTOGRAM_SUFFIXES:
            if name.endswith(suf) and name[: -len(suf)] in exported:
                return True
        return False

    used_exported: set[str] = set()  # exported names as queried (with suffixes)
    for where, expr in exprs:
        names = metric_names(expr)
        if not names:
            errors.append(f"{where}: no metric found in {expr!r}")
        for n in sorted(names):
            if not known(n):
                errors.append(f"{where}: unknown metric {n!r} (not a recording rule, "
                              f"not in {metrics_path})")
            elif n not in recording:
                used_exported.add(n)
        for j in job_values(expr):
            if j not in JOBS:
                errors.append(f"{where}: job={j!r} is not one of {sorted(JOBS)}")

    # Recording rules resolve to exported metrics (no cycles, no dangling names).
    def resolve(name: str, stack: tuple[str, ...]) -> None:
        if name in stack:
            errors.append(f"recording rule cycle: {' -> '.join(stack + (name,))}")
            return
        for n in metric_names(recording[name]):
            if n in recording:
                resolve(n, stack + (name,))

    for name in recording:
        resolve(name, ())

    ids = [p.get("id") for p in all_panels(dash)]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        errors.append(f"{dash_path}: duplicate panel ids {sorted(dup)}")
    for p in all_panels(dash):
        if p.get("type") == "row":
            continue
        for obj in [p] + list(p.get("targets") or []):
            ds = obj.get("datasource")
            if not (isinstance(ds, dict) and ds.get("uid") == "${DS_PROMETHEUS}"):
                errors.append(f"{dash_path}: panel {p.get('id')} {p.get('title')!r}: "
                              f"datasource {ds!r} is not ${{DS_PROMETHEUS}}")
    var_names = {v.get("name") for v in (dash.get("templating") or {}).get("list") or []}
    input_names = {i.get("name") for i in dash.get("__inputs") or []}
    if "DS_PROMETHEUS" not in var_names | input_names:
        errors.append(f"{dash_path}: DS_PROMETHEUS is neither a variable nor an input")

    families = {n for n in exported if n in used_exported or any(
        n + suf in used_exported for suf in HISTOGRAM_SUFFIXES)}
    for n in sorted(exported - families):
        print(f"check_dashboard: note: exported {n} is used by no rule or panel", file=sys.stderr)
    for e in errors:
        print(f"check_dashboard: {e}", file=sys.stderr)
    if errors:
        print(f"check_dashboard: FAILED ({len(errors)} problems)", file=sys.stderr)
        return 1
    print(f"check_dashboard: ok: {len(queries)} dashboard queries, {len(exprs) - len(queries)} "
          f"rule expressions, {len(recording)} recording rules, "
          f"{len(families)} of {len(exported)} exported metric families used")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
