#!/usr/bin/env bash
# Checks the deployment files offline: the Dockerfile (hadolint), the Helm chart (helm lint
# --strict, helm template, kubernetes-validate --strict for Kubernetes 1.29 and 1.33, checkov with
# no failed check, refused bad values), the values files (yamllint), pinned images and the
# Grafana board's metric names. Installs its tools first (scripts/install-deploy-tools.sh).
# Exits non-zero on any failure and prints a summary.
#   scripts/check-deploy.sh
set -euo pipefail
cd "$(dirname "$0")/.."

bin="$(scripts/install-deploy-tools.sh)"
export PATH="${bin}:${PATH}"
py="$(dirname "$(readlink -f "${bin}/yamllint")")/python"
# checkov: no calls to Prisma Cloud (offline; no BC_* id mapping needed).
export BC_SKIP_MAPPING=TRUE

chart=deploy/helm/dolphin
dockerfile=deploy/docker/Dockerfile
namespace=dolphin
kube_versions=(1.29.0 1.33.0)
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

results=()
failed=0
step() {
    local name=$1
    shift
    local log="${out}/step-${#results[@]}.log"
    local start=$SECONDS
    if "$@" >"$log" 2>&1; then
        results+=("$(printf 'ok    %-58s %3d s' "$name" $((SECONDS - start)))")
    else
        results+=("$(printf 'FAIL  %-58s %3d s' "$name" $((SECONDS - start)))")
        failed=$((failed + 1))
        echo "--- FAILED: $name" >&2
        cat "$log" >&2
    fi
}

# Renders: name and helm arguments (beyond the chart). "full" and "external-etcd" turn on what
# the defaults leave off (learn job, HPA, secrets, ServiceMonitor, PVC, baked model, external
# etcd) so that every template is linted, validated and checked.
render_names=(default cpu-smollm2 gpu full external-etcd)
declare -A render_args=(
    [default]=""
    [cpu-smollm2]="-f ${chart}/values-cpu-smollm2.yaml"
    [gpu]="-f ${chart}/values-gpu.yaml"
    [full]="-f ${chart}/values-cpu-smollm2.yaml --set learn.enabled=true,router.policy=dolphin,router.autoscaling.enabled=true,tls.secretName=dolphin-tls,tls.serverName=dolphin.dolphin.internal,apiKeys.secretName=dolphin-keys,serviceMonitor.enabled=true,model.existingClaim=dolphin-models,model.pipIndexUrl=https://pip-mirror.example.internal/simple,engine.modelName=smollm2"
    [external-etcd]="--set etcd.bundled.enabled=false,etcd.external.endpoints={http://etcd-a.db.svc:2379,http://etcd-b.db.svc:2379},engine.kind=candle,model.baked=true,learn.enabled=true,learn.hook=false,router.policy=dolphin,networkPolicy.enabled=false"
)

# --- Dockerfile --------------------------------------------------------------------------------
step "hadolint ${dockerfile}" hadolint "$dockerfile"

# --- values files ------------------------------------------------------------------------------
yamllint_config='{extends: default, rules: {line-length: {max: 100}, document-start: disable, truthy: {check-keys: false}}}'
step "yamllint values files and Chart.yaml" \
    yamllint --strict -d "$yamllint_config" "$chart"/values*.yaml "$chart/Chart.yaml"

# --- helm lint and template --------------------------------------------------------------------
for name in "${render_names[@]}"; do
    # shellcheck disable=SC2086 # the arguments are split on purpose
    step "helm lint --strict (${name})" helm lint --strict "$chart" --namespace "$namespace" ${render_args[$name]}
    # shellcheck disable=SC2086
    step "helm template (${name})" \
        bash -c 'helm template dolphin "$1" --namespace "$2" "${@:4}" >"$3"' _ \
        "$chart" "$namespace" "${out}/${name}.yaml" ${render_args[$name]}
done

# NOTES.txt renders (client-side dry run: no cluster is contacted).
notes_render() {
    local r
    for r in default gpu full; do
        # shellcheck disable=SC2086
        KUBECONFIG=/dev/null helm install dolphin "$chart" --namespace "$namespace" \
            --dry-run=client ${render_args[$r]} | sed -n '/^NOTES:/,$p' | grep -q 'Router (OpenAI' \
            || { echo "NOTES.txt did not render ($r)"; return 1; }
    done
}
step "NOTES.txt renders (default, gpu, full)" notes_render

# Splits each render: ServiceMonitor (a CRD, in no Kubernetes schema) goes to its own file and is
# checked structurally (apiVersion, endpoints naming ports of the release's Services); the rest is
# validated by kubernetes-validate. Also checks: every image pinned (tag not latest, or a digest),
# every workload container has an explicit command, every checkov skip carries a reason.
split_and_check() {
    "$py" - "$out" "${render_names[@]}" <<'PY'
import os, re, sys, yaml
out, names = sys.argv[1], sys.argv[2:]
problems = []
for name in names:
    docs = [d for d in yaml.safe_load_all(open(os.path.join(out, name + ".yaml"))) if d]
    core = [d for d in docs if d.get("kind") != "ServiceMonitor"]
    monitors = [d for d in docs if d.get("kind") == "ServiceMonitor"]
    with open(os.path.join(out, name + ".core.yaml"), "w") as f:
        yaml.safe_dump_all(core, f, sort_keys=False)
    services = [d for d in docs if d.get("kind") == "Service"]
    for m in monitors:
        if m.get("apiVersion") != "monitoring.coreos.com/v1":
            problems.append(f"{name}: ServiceMonitor apiVersion {m.get('apiVersion')}")
        ports = {p.get("name") for s in services for p in s["spec"].get("ports", [])}
        for ep in m["spec"].get("endpoints", []):
            if ep.get("port") not in ports:
                problems.append(f"{name}: ServiceMonitor endpoint port {ep.get('port')} names no Service port")
    for d in docs:
        kind, meta = d.get("kind"), d.get("metadata", {})
        for key, val in (meta.get("annotations") or {}).items():
            if key.startswith("checkov.io/skip") and not re.match(r"^CKV2?_[A-Z0-9_]+=\S.{8,}", str(val)):
                problems.append(f"{name}: {kind} {meta.get('name')}: checkov skip without a reason: {val}")
        spec = d.get("spec", {})
        pod = spec.get("template", {}).get("spec") if kind in ("Deployment", "StatefulSet", "Job") else None
        if pod is None:
            continue
        for c in pod.get("initContainers", []) + pod.get("containers", []):
            where = f"{name}: {kind} {meta.get('name')} container {c['name']}"
            image = c.get("image", "")
            ref = image.rsplit("/", 1)[-1]
            if "@sha256:" not in image and (":" not in ref or ref.endswith(":latest")):
                problems.append(f"{where}: image {image!r} is not pinned")
            if not c.get("command"):
                problems.append(f"{where}: no explicit command")
for p in problems:
    print(p)
sys.exit(1 if problems else 0)
PY
}
step "pinned images, explicit commands, skip reasons, ServiceMonitor" split_and_check

for name in "${render_names[@]}"; do
    for k in "${kube_versions[@]}"; do
        step "kubernetes-validate --strict -k ${k} (${name})" \
            kubernetes-validate --strict --quiet -k "$k" "${out}/${name}.core.yaml"
    done
done

# --- checkov -----------------------------------------------------------------------------------
# One run over every render (ServiceMonitor included: checkov has no checks for it). Skips are
# declared in the chart (checkov.io/skipN annotations with reasons); none may fail.
checkov_run() {
    mkdir -p "${out}/checkov"
    local r
    for r in "${render_names[@]}"; do cp "${out}/${r}.yaml" "${out}/checkov/"; done
    checkov -d "${out}/checkov" --framework kubernetes --skip-download --compact -o json \
        >"${out}/checkov.json" 2>"${out}/checkov.err" || true
    "$py" - "${out}/checkov.json" <<'PY'
import json, sys
data = json.load(open(sys.argv[1]))
reports = data if isinstance(data, list) else [data]
failed = 0
for r in reports:
    s = r["summary"]
    print(f"checkov {r['check_type']}: passed {s['passed']}, failed {s['failed']}, skipped {s['skipped']}")
    skips = sorted({(c["check_id"], c["check_result"].get("suppress_comment", "")) for c in r["results"]["skipped_checks"]})
    for cid, why in skips:
        print(f"  skip {cid}: {why}")
    for c in r["results"]["failed_checks"]:
        print(f"  FAILED {c['check_id']} {c['check_name']}: {c['resource']} ({c['file_path']})")
    failed += s["failed"] + s.get("parsing_errors", 0)
sys.exit(1 if failed or not reports else 0)
PY
}
step "checkov (kubernetes, every render)" checkov_run

# --- values the chart must refuse --------------------------------------------------------------
refuses() {
    local bad
    for bad in "$@"; do
        if helm template dolphin "$chart" --namespace "$namespace" --set "$bad" >/dev/null 2>&1; then
            echo "accepted bad values: $bad"
            return 1
        fi
        echo "refused: $bad"
    done
}
step "bad values refused (schema and template checks)" refuses \
    "etcd.bundled.replicas=2" \
    "image.tag=latest" \
    "etcd.bundled.image.tag=latest" \
    "unknownKey=1" \
    "router.unknownKey=1" \
    "engine.kind=vllm" \
    "drain.terminationGracePeriodSeconds=90" \
    "router.terminationGracePeriodSeconds=30" \
    "etcd.bundled.enabled=false" \
    "etcd.external.endpoints={http://etcd:2379}" \
    "learn.enabled=true" \
    "serviceMonitor.enabled=true,decode.headlessService.enabled=false" \
    "tls.secretName=dolphin-tls" \
    "ports.routerAdmin=0" \
    "router.service.adminPort=65536" \
    "ports.routerMetrics=8000"

# --- Grafana board -----------------------------------------------------------------------------
# Every dolphin_* metric the board queries is one the binaries record.
board_metrics() {
    "$py" - "$chart/dashboards/dolphin.json" router/src/metrics.rs worker-common/src/metrics.rs \
        engine/src/metrics.rs kv-transfer/src/metrics.rs handoff/src/metrics.rs \
        cluster/src/telemetry.rs <<'PY'
import json, re, sys
board = json.load(open(sys.argv[1]))
known = set()
for src in sys.argv[2:]:
    known |= set(re.findall(r'"(dolphin_[a-z0-9_]+)"', open(src).read()))
used = set()
def walk(p):
    for t in p.get("targets", []):
        names = re.findall(r"\b(dolphin_[a-z0-9_]+)", t.get("expr", ""))
        # A histogram's series: name_bucket, name_sum, name_count.
        used.update(re.sub(r"_(bucket|sum|count)$", "", n) for n in names)
    for q in p.get("panels", []):
        walk(q)
for p in board["panels"]:
    walk(p)
unknown = sorted(used - known)
print(f"{len(used)} metrics queried, {len(known)} recorded")
for m in unknown:
    print(f"unknown metric: {m}")
sys.exit(1 if unknown or not used else 0)
PY
}
step "Grafana board uses real metric names" board_metrics

# --- summary -----------------------------------------------------------------------------------
echo
echo "=== check-deploy summary (helm $(helm version --template '{{.Version}}'), $(hadolint --version | awk '{print $NF}' | head -n 1) hadolint, kubernetes-validate $(kubernetes-validate --version 2>/dev/null | awk '{print $NF}'), checkov $(checkov --version 2>/dev/null), $(yamllint --version))"
printf '%s\n' "${results[@]}"
grep -h '^  skip\|^checkov' "${out}"/step-*.log 2>/dev/null | sort -u || true
if ((failed)); then
    echo "=== ${failed} check(s) FAILED"
    exit 1
fi
echo "=== all ${#results[@]} checks passed"
