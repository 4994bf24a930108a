#!/usr/bin/env python3
"""Generates deploy/grafana/tandem.json, the tandem Grafana dashboard (Grafana 10+).

The JSON is committed; edit this script, then run
    python3 scripts/deploy/gen_dashboard.py > deploy/grafana/tandem.json
scripts/check-deploy.sh fails when the committed JSON and this script disagree.
Every panel queries the recording rules of deploy/prometheus/tandem-recording.rules.yml
where one fits, raw metrics otherwise. The datasource is the dashboard variable
${DS_PROMETHEUS} (also declared as an import input), so the file works both through
Dashboards > Import and through file provisioning.
"""

import json
import sys

DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
V = 'job="tandem-verifier"'
D = 'job="tandem-drafter"'

_next_id = [0]


def _id():
    _next_id[0] += 1
    return _next_id[0]


def target(expr, legend, ref):
    return {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref, "range": True}


def panel(title, kind, x, y, w, h, exprs, unit="short", desc="", **extra):
    refs = "ABCDEFGH"
    p = {
        "id": _id(),
        "type": kind,
        "title": title,
        "description": desc,
        "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": [target(e, l, refs[i]) for i, (e, l) in enumerate(exprs)],
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {},
    }
    if kind == "timeseries":
        p["fieldConfig"]["defaults"]["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"mode": extra.pop("stacking", "none"), "group": "A"},
        }
        p["options"] = {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "none"},
        }
    if "min" in extra:
        p["fieldConfig"]["defaults"]["min"] = extra.pop("min")
    if "max" in extra:
        p["fieldConfig"]["defaults"]["max"] = extra.pop("max")
    if "thresholds" in extra:
        p["fieldConfig"]["defaults"]["thresholds"] = {
            "mode": "absolute",
            "steps": [{"color": c, "value": v} for v, c in extra.pop("thresholds")],
        }
    if kind in ("stat", "gauge", "bargauge"):
        p["options"] = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "orientation": "auto",
        }
        if kind == "stat":
            p["options"].update({"colorMode": "value", "graphMode": "area", "textMode": "auto"})
    assert not extra, extra
    return p


def acceptance_histogram(x, y, w, h):
    """Bar gauge of tokens emitted per round over the dashboard's time range."""
    p = panel("Tokens per round (distribution over range)", "bargauge", x, y, w, h,
              [(f"sum by (le) (increase(tandem_acceptance_length_bucket{{{V}}}[$__range]))", "{{le}}")],
              unit="short", min=0,
              desc="tandem_acceptance_length: tokens emitted per drafting round (cumulative buckets le=1..gamma+1).")
    p["targets"][0].update({"format": "heatmap", "instant": True, "range": False})
    p["options"].update({"displayMode": "basic", "orientation": "vertical", "showUnfilled": True})
    return p


def row(title, y):
    return {"id": _id(), "type": "row", "title": title, "collapsed": False,
            "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}, "panels": []}


def dashboard():
    panels = []
    y = 0
    panels.append(row("Speculation", y))
    y += 1
    panels += [
        panel("Mean acceptance length (5m)", "stat", 0, y, 4, 8,
              [(f"tandem_job:mean_acceptance_length:rate5m{{{V}}}", "fleet")],
              unit="none", min=1,
              thresholds=[(None, "red"), (1.5, "orange"), (2.5, "green")],
              desc="Tokens emitted per drafting round: 1 + accepted/drafts. 1 = the drafter never helps; gamma+1 is the ceiling."),
        panel("Mean acceptance length", "timeseries", 4, y, 7, 8,
              [(f"tandem:mean_acceptance_length:rate1m{{{V}}}", "{{instance}} (1m)"),
               (f"tandem_job:mean_acceptance_length:rate5m{{{V}}}", "fleet (5m)")],
              unit="none", min=1,
              desc="1 + rate(tandem_spec_accepted_tokens_total) / rate(tandem_spec_drafts_total), per verifier and for the fleet."),
        panel("Acceptance rate per position (5m)", "timeseries", 11, y, 7, 8,
              [(f"tandem_job:acceptance_rate_per_position:rate5m{{{V}}}", "position {{position}}"),
               (f"tandem_job:draft_acceptance_rate:rate5m{{{V}}}", "all drafted tokens")],
              unit="percentunit", min=0, max=1,
              desc="Share of drafting rounds whose token at the position was accepted (vLLM's definition), and the share of all drafted tokens accepted."),
        acceptance_histogram(18, y, 6, 8),
    ]
    y += 8
    panels.append(row("Confidences", y))
    y += 1
    panels += [
        panel("Acceptance by drafter confidence (5m)", "timeseries", 0, y, 12, 8,
              [(f"sum by (confidence) (rate(tandem_spec_accepted_tokens_by_confidence_total{{{V}}}[5m]))"
                f" / sum by (confidence) (rate(tandem_spec_reached_tokens_by_confidence_total{{{V}}}[5m]))",
                "confidence {{confidence}}")],
              unit="percentunit", min=0, max=1,
              desc="Share of drafted tokens accepted, among those whose predecessors were all accepted, by the confidence the drafter sent. With a calibrated drafter each line sits inside its bucket; a line outside it means the calibration is stale (run tandem calibrate again)."),
        panel("Confidence cuts", "timeseries", 12, y, 12, 8,
              [(f"sum(rate(tandem_spec_confidence_cut_blocks_total{{{V}}}[5m]))", "blocks cut/s"),
               (f"sum(rate(tandem_spec_confidence_cut_tokens_total{{{V}}}[5m]))", "tokens left unverified/s"),
               (f"sum(rate(tandem_spec_draft_tokens_total{{{V}}}[5m]))", "tokens verified/s")],
              unit="short", min=0,
              desc="Drafted blocks the verifier shortened because their calibrated confidences did not pay for verifying the rest."),
    ]
    y += 8
    panels.append(row("Latency", y))
    y += 1
    panels += [
        panel("Time to first token", "timeseries", 0, y, 8, 8,
              [(f"tandem_job:time_to_first_token_seconds:p50_rate5m{{{V}}}", "p50"),
               (f"tandem_job:time_to_first_token_seconds:p99_rate5m{{{V}}}", "p99")],
              unit="s", min=0, desc="Request arrival to first streamed token (queueing + prefill)."),
        panel("Inter-token latency", "timeseries", 8, y, 8, 8,
              [(f"tandem_job:inter_token_latency_seconds:p50_rate5m{{{V}}}", "p50"),
               (f"tandem_job:inter_token_latency_seconds:p99_rate5m{{{V}}}", "p99")],
              unit="s", min=0, desc="Gap between consecutive streamed tokens."),
        panel("Draft vs verify time share", "timeseries", 16, y, 8, 8,
              [(f"tandem_job:draft_time_share:rate5m{{{V}}}", "draft (RPC round trip)"),
               (f"tandem_job:verify_time_share:rate5m{{{V}}}", "verify (target forward)")],
              unit="percentunit", min=0, max=1, stacking="percent",
              desc="Where a round's time goes on the verifier: waiting for the drafter vs the target forward."),
    ]
    y += 8
    panels += [
        panel("Drafter block latency", "timeseries", 0, y, 8, 8,
              [(f"tandem_job:draft_seconds:p50_rate5m{{{D}}}", "drafter compute p50"),
               (f"tandem_job:draft_seconds:p99_rate5m{{{D}}}", "drafter compute p99"),
               (f"tandem_job:draft_rpc_seconds:p99_rate5m{{{V}}}", "verifier round trip p99")],
              unit="s", min=0, desc="tandem_draft_seconds (drafter side, compute per block) and tandem_draft_rpc_seconds (verifier side)."),
        panel("Verify forward p99", "timeseries", 8, y, 8, 8,
              [(f"tandem_job:verify_seconds:p99_rate5m{{{V}}}", "verify p99")],
              unit="s", min=0, desc="One target forward over gamma+1 positions."),
        panel("End-to-end request latency", "timeseries", 16, y, 8, 8,
              [(f"tandem_job:e2e_request_latency_seconds:p50_rate5m{{{V}}}", "p50"),
               (f"tandem_job:e2e_request_latency_seconds:p99_rate5m{{{V}}}", "p99")],
              unit="s", min=0),
    ]
    y += 8
    panels.append(row("Load", y))
    y += 1
    panels += [
        panel("Throughput", "timeseries", 0, y, 8, 8,
              [(f"tandem_job:generated_tokens:rate1m{{{V}}}", "generated tokens/s"),
               (f"tandem_job:prompt_tokens:rate1m{{{V}}}", "prompt tokens/s")],
              unit="short", min=0),
        panel("Requests by finish reason", "timeseries", 8, y, 8, 8,
              [(f"tandem_job:requests:rate5m{{{V}}}", "{{finish_reason}}")],
              unit="reqps", min=0, stacking="normal"),
        panel("Active sessions", "timeseries", 16, y, 8, 8,
              [(f"tandem_job:active_sessions:sum{{{V}}}", "verifier"),
               (f"tandem_job:active_sessions:sum{{{D}}}", "drafters"),
               (f"sum(tandem_queued_requests{{{V}}})", "queued requests")],
              unit="short", min=0,
              desc="tandem_active_sessions by job; drafters count the session mirrors they hold."),
    ]
    y += 8
    panels += [
        panel("KV cache usage", "timeseries", 0, y, 8, 8,
              [(f"tandem_kv_cache_usage_ratio{{{V}}}", "{{instance}}")],
              unit="percentunit", min=0, max=1,
              thresholds=[(None, "green"), (0.9, "red")],
              desc="Share of TANDEM_KV_CACHE_BYTES in use, per verifier."),
        panel("Drafters available (per verifier)", "timeseries", 8, y, 8, 8,
              [(f"tandem_drafters_available{{{V}}}", "{{instance}}")],
              unit="short", min=0),
        panel("Verifier errors", "timeseries", 16, y, 8, 8,
              [(f"sum(rate(tandem_proposer_failures_total{{{V}}}[5m]))", "proposer failures/s"),
               (f"sum(rate(tandem_draft_rpc_errors_total{{{V}}}[5m]))", "draft RPC errors/s")],
              unit="short", min=0),
    ]
    y += 8
    panels.append(row("Drafters", y))
    y += 1
    panels += [
        panel("Snapshot bytes received", "timeseries", 0, y, 8, 8,
              [(f"tandem_job:drafter_snapshot_bytes:rate1m{{{D}}}", "all drafters"),
               (f"rate(tandem_drafter_snapshot_bytes_total{{{D}}}[1m])", "{{instance}}")],
              unit="Bps", min=0, desc="Target-state mirror traffic from verifiers to drafters."),
        panel("Blocks drafted", "timeseries", 8, y, 8, 8,
              [(f"tandem_job:drafter_blocks:rate1m{{{D}}}", "blocks/s"),
               (f"sum(rate(tandem_drafter_draft_tokens_total{{{D}}}[1m]))", "tokens/s"),
               (f"sum(rate(tandem_drafter_sessions_total{{{D}}}[5m]))", "sessions opened/s")],
              unit="short", min=0),
        panel("Drafter errors by type", "timeseries", 16, y, 8, 8,
              [(f"sum by (error_type) (rate(tandem_drafter_errors_total{{{D}}}[5m]))", "{{error_type}}")],
              unit="short", min=0),
    ]
    return {
        "__inputs": [{
            "name": "DS_PROMETHEUS", "label": "Prometheus", "description": "",
            "type": "datasource", "pluginId": "prometheus", "pluginName": "Prometheus",
        }],
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.0.0"},
            {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
            {"type": "panel", "id": "timeseries", "name": "Time series", "version": ""},
            {"type": "panel", "id": "stat", "name": "Stat", "version": ""},
        ],
        "uid": "tandem-overview",
        "title": "tandem: speculative decoding",
        "description": "Verifier and drafter services of tandem (deploy/grafana/tandem.json).",
        "tags": ["tandem", "speculative-decoding"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "refresh": "10s",
        "schemaVersion": 38,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": [{
            "name": "DS_PROMETHEUS",
            "label": "Prometheus",
            "type": "datasource",
            "query": "prometheus",
            "current": {},
            "hide": 0,
            "refresh": 1,
            "regex": "",
            "includeAll": False,
            "multi": False,
            "options": [],
        }]},
        "panels": panels,
    }


if __name__ == "__main__":
    json.dump(dashboard(), sys.stdout, indent=2)
    sys.stdout.write("\n")
