#!/usr/bin/env bash
# Checks the Helm chart and the example manifests:
#   - helm lint, with the default values and with every charts/dra-cpu/ci/*-values.yaml,
#   - a client-side dry-run install of each (renders NOTES.txt too),
#   - helm template for each of those modes, every rendered object validated
#     against the Kubernetes 1.34 and 1.37 OpenAPI schemas (strict: unknown
#     fields are errors),
#   - what each mode renders (containers, probes, mounts, config files),
#   - that every config-file key the chart writes is a flag of the binary that
#     reads it (binaries from target/debug, built when missing),
#   - that bad values fail at install time with a message naming the value,
#   - every docs/examples manifest against both schemas,
#   - with metrics.serviceMonitor and metrics.dashboard on: the ServiceMonitor
#     against its CRD's schema (python jsonschema), its Service, the dashboard
#     ConfigMap (scripts/check-monitoring.py).
# helm and kubernetes-validate come from scripts/install-deps.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

chart=charts/dra-cpu
schema_versions=(1.34.0 1.37.0)
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

fail() {
  echo "check-chart: FAILED: $*" >&2
  exit 1
}

command -v helm >/dev/null || fail "helm not found: run scripts/install-deps.sh"
python="$(command -v python3 || true)"
[ -n "$python" ] || fail "python3 not found"
validator="$(command -v kubernetes-validate || true)"
if [ -z "$validator" ]; then
  validator="$("$python" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/kubernetes-validate"
  [ -x "$validator" ] || fail "kubernetes-validate not found: run scripts/install-deps.sh"
fi

validate() {
  # Quiet on success; on failure the validator names the object and field.
  local file="$1" version
  for version in "${schema_versions[@]}"; do
    "$validator" --quiet --strict -k "$version" "$file" ||
      fail "$file does not validate against Kubernetes $version"
  done
}

# --- lint and render every mode ----------------------------------------------
modes=(default)
for values in "$chart"/ci/*-values.yaml; do
  mode="$(basename "$values" -values.yaml)"
  modes+=("$mode")
done
for mode in "${modes[@]}"; do
  args=()
  [ "$mode" = default ] || args=(-f "$chart/ci/$mode-values.yaml")
  helm lint --quiet --strict "$chart" "${args[@]}" >"$out/lint-$mode.log" 2>&1 ||
    { cat "$out/lint-$mode.log" >&2; fail "helm lint ($mode)"; }
  helm template dra-cpu "$chart" --namespace dra-cpu "${args[@]}" >"$out/$mode.yaml" 2>"$out/render-$mode.log" ||
    { cat "$out/render-$mode.log" >&2; fail "helm template ($mode)"; }
  validate "$out/$mode.yaml"
  # helm template skips NOTES.txt; a client-side dry-run install renders it.
  helm install --dry-run=client dra-cpu "$chart" --namespace dra-cpu "${args[@]}" >"$out/install-$mode.log" 2>&1 ||
    { cat "$out/install-$mode.log" >&2; fail "helm install --dry-run ($mode)"; }
  grep -q '^NOTES:' "$out/install-$mode.log" || fail "helm install --dry-run ($mode) printed no notes"
done
# The runtime setting of nri.requiredByRuntime is printed with the plugin's name.
grep -qF 'required_plugins = ["cpu_pinning"]' "$out/install-everything-set.log" ||
  fail "NOTES.txt (everything-set) does not print the containerd required_plugins setting"
grep -qF 'run unpinned until it registers' "$out/install-default.log" ||
  fail "NOTES.txt (default) does not say what happens without the runtime setting"
helm install dra-cpu "$chart" --dry-run=client --namespace dra-cpu --set nri.requiredByRuntime.enabled=true >"$out/install-required.log" 2>&1 ||
  { cat "$out/install-required.log" >&2; fail "helm install --dry-run (nri.requiredByRuntime.enabled=true)"; }
grep -q 'WARNING: hostNetwork is false' "$out/install-required.log" ||
  fail "NOTES.txt (requiredByRuntime without hostNetwork) does not warn about the pod network"
if grep -q 'WARNING: hostNetwork is false' "$out/install-everything-set.log"; then
  fail "NOTES.txt (everything-set, hostNetwork true) warns about the pod network"
fi
echo "check-chart: lint, render and schema validation (Kubernetes ${schema_versions[*]}) passed for modes: ${modes[*]}"

# --- what the modes render -------------------------------------------------------
"$python" - "$out" <<'EOF' || fail "rendered objects are not what the values ask for"
import sys, yaml

out = sys.argv[1]
problems = []

def load(mode):
    with open(f"{out}/{mode}.yaml") as f:
        return [d for d in yaml.safe_load_all(f) if d]

def one(docs, kind):
    found = [d for d in docs if d["kind"] == kind]
    return found[0] if len(found) == 1 else None

def check(mode, cond, what):
    if not cond:
        problems.append(f"{mode}: {what}")

def configs(docs):
    data = one(docs, "ConfigMap")["data"]
    return {name: yaml.safe_load(text) for name, text in data.items()}

def pod(docs):
    return one(docs, "DaemonSet")["spec"]["template"]["spec"]

for mode in ["default", "individual", "group-by-socket", "mixed", "no-node-allocatable-mapping", "no-nri", "everything-set", "distribute-across-cores"]:
    docs = load(mode)
    kinds = sorted(d["kind"] for d in docs)
    wanted = ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "DeviceClass", "ServiceAccount", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    if mode == "everything-set":
        # lowLatencyTuning: a Role to read (only) the plugin's own DaemonSet.
        wanted += ["Role", "RoleBinding"]
        role = one(docs, "Role")
        daemonset = one(docs, "DaemonSet")["metadata"]["name"]
        check(mode, role["rules"] == [{"apiGroups": ["apps"], "resources": ["daemonsets"], "resourceNames": [daemonset], "verbs": ["get", "list", "watch"]}], f"Role rules {role['rules']}")
    check(mode, kinds == sorted(wanted), f"objects {kinds}")
    spec = pod(docs)
    containers = {c["name"]: c for c in spec["containers"]}
    want = ["dra-plugin"] if mode == "no-nri" else ["dra-plugin", "nri-plugin"]
    check(mode, sorted(containers) == want, f"containers {sorted(containers)}, want {want}")
    ports = set()
    for name, c in containers.items():
        for probe in ("livenessProbe", "readinessProbe"):
            check(mode, "httpGet" in c.get(probe, {}), f"{name} has no {probe}")
        port = c["ports"][0]["containerPort"]
        check(mode, port not in ports, f"{name} shares port {port}")
        ports.add(port)
        sc = c["securityContext"]
        check(mode, sc.get("privileged") is False and sc.get("allowPrivilegeEscalation") is False, f"{name} may gain privileges")
        check(mode, sc.get("capabilities", {}).get("drop") == ["ALL"], f"{name} keeps capabilities")
    cfg = configs(docs)
    dra = cfg["dra-plugin.yaml"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m for m in containers["dra-plugin"]["volumeMounts"]}
    check(mode, volumes["state"]["hostPath"]["path"] == dra["state-dir"].rstrip("/"), "state hostPath is not the state dir")
    check(mode, dra["coordination-socket"].startswith(dra["state-dir"].rstrip("/") + "/"), "coordination socket outside the state dir")
    check(mode, mounts["sysfs"].get("readOnly") is True and volumes["sysfs"]["hostPath"]["path"] == "/sys", "sysfs is not the host's, read-only")
    check(mode, mounts["sysfs"]["mountPath"] == dra["sysfs-root"].rstrip("/") + "/sys", "sysfs-root does not point at the sysfs mount")
    kubelet = dra["kubelet-root-dir"]
    check(mode, mounts["plugin-dir"]["mountPath"] == volumes["plugin-dir"]["hostPath"]["path"] == f"{kubelet}/plugins/{dra['driver-name']}", "plugin dir differs between host and container")
    check(mode, mounts["plugins-registry"]["mountPath"] == volumes["plugins-registry"]["hostPath"]["path"] == f"{kubelet}/plugins_registry", "registration dir differs between host and container")
    check(mode, mounts["cdi"]["mountPath"] == volumes["cdi"]["hostPath"]["path"] == dra["cdi-dir"], "CDI dir differs between host and container")
    check(mode, mounts["device-metadata"]["mountPath"] == volumes["device-metadata"]["hostPath"]["path"] == dra["device-metadata-dir"], "device metadata dir differs between host and container")
    dc = one(docs, "DeviceClass")
    check(mode, dc["spec"]["selectors"][0]["cel"]["expression"] == f'device.driver == "{dra["driver-name"]}"', "DeviceClass does not select the driver")
    binding = one(docs, "ClusterRoleBinding")
    check(mode, binding["roleRef"]["name"] == one(docs, "ClusterRole")["metadata"]["name"], "binding names another role")
    check(mode, binding["subjects"][0]["name"] == spec["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"], "binding, pod and service account disagree")
    if mode == "no-nri":
        check(mode, "nri-plugin.yaml" not in cfg and "nri" not in volumes, "NRI config or socket still rendered")
    else:
        nri = cfg["nri-plugin.yaml"]
        nri_mounts = {m["name"]: m for m in containers["nri-plugin"]["volumeMounts"]}
        check(mode, nri["coordination-socket"] == dra["coordination-socket"], "the two processes use different coordination sockets")
        check(mode, nri["mixed-allocation-mode"] == dra["mixed-allocation-mode"], "the two processes disagree on mixed allocation")
        check(mode, nri["cdi-dir"] == dra["cdi-dir"], "the two processes use different CDI dirs")
        check(mode, nri_mounts["state"].get("readOnly") is True, "nri-plugin can write the store")
        check(mode, nri_mounts["nri"]["mountPath"] == volumes["nri"]["hostPath"]["path"] == nri["nri-socket"].rsplit("/", 1)[0], "NRI socket dir differs between host and container")
        check(mode, len(nri["plugin-index"]) == 2 and nri["plugin-index"].isdigit(), f"plugin index {nri['plugin-index']!r}")
        check(mode, nri.get("reserved-cpus") == dra.get("reserved-cpus"), "the two processes disagree on reserved CPUs")
        check(mode, nri_mounts["sysfs"]["mountPath"] == nri["sysfs-root"].rstrip("/") + "/sys" and nri_mounts["sysfs"].get("readOnly") is True, "nri-plugin's sysfs-root is not its read-only sysfs mount")
        check(mode, containers["nri-plugin"]["readinessProbe"]["httpGet"]["path"] == "/readyz", "nri-plugin readiness is not /readyz")
        # Containers' cpusets are read back from the host's hierarchy.
        check(mode, nri_mounts["host-cgroup"]["mountPath"] == nri["cgroup-root"] and volumes["host-cgroup"]["hostPath"]["path"] == "/sys/fs/cgroup", "nri-plugin's cgroup-root is not the host's /sys/fs/cgroup")
        check(mode, nri["cpuset-check-seconds"] == 10, f"nri-plugin's cpuset-check-seconds = {nri.get('cpuset-check-seconds')!r}, want 10")
        if not dra["low-latency-tuning"] and not nri.get("host-cgroups"):
            check(mode, nri_mounts["host-cgroup"].get("readOnly") is True and nri_mounts["host-cgroup"].get("recursiveReadOnly") == "IfPossible", "nri-plugin can write the host cgroups without lowLatencyTuning or hostCgroups")
        if dra["low-latency-tuning"]:
            # loadBalancing off: dra-plugin reads the hierarchy nri-plugin writes.
            check(mode, mounts["host-cgroup"]["mountPath"] == dra["cgroup-root"] and mounts["host-cgroup"].get("readOnly") is True, "dra-plugin's cgroup-root is not its read-only host cgroup mount")
            check(mode, nri_mounts["host-cgroup"]["mountPath"] == nri["cgroup-root"] and not nri_mounts["host-cgroup"].get("readOnly"), "nri-plugin's cgroup-root is not its writable host cgroup mount")
            check(mode, volumes["host-cgroup"]["hostPath"]["path"] == "/sys/fs/cgroup", "host-cgroup is not the host's /sys/fs/cgroup")
    if "kubeconfig" in dra:
        # The file the config names is the Secret's, mounted read-only.
        mount = mounts.get("kubeconfig", {})
        secret = volumes.get("kubeconfig", {}).get("secret", {})
        items = secret.get("items", [])
        check(mode, mount.get("readOnly") is True and len(items) == 1 and items[0]["key"] == "kubeconfig" and f"{mount.get('mountPath')}/{items[0]['path']}" == dra["kubeconfig"], f"kubeconfig {dra['kubeconfig']} is not the mounted Secret's file")
        check(mode, secret.get("secretName") == "dra-cpu-kubeconfig", f"kubeconfig Secret {secret.get('secretName')!r}")
    else:
        check(mode, "kubeconfig" not in mounts and "kubeconfig" not in volumes, "a kubeconfig volume without --kubeconfig")
    if mode == "no-nri" or not dra["low-latency-tuning"]:
        check(mode, "host-cgroup" not in mounts, "dra-plugin mounts the host cgroups without lowLatencyTuning and nri-plugin")
    expect = {
        "default": {"cpu-device-mode": "auto", "group-by": "numanode", "mixed-allocation-mode": False, "disable-node-allocatable-mapping": False, "expose-pcie-roots": False},
        "individual": {"cpu-device-mode": "individual"},
        "group-by-socket": {"cpu-device-mode": "auto", "group-by": "socket"},
        "distribute-across-cores": {"allocation-policy": "distribute-across-cores"},
        "mixed": {"mixed-allocation-mode": True},
        "no-node-allocatable-mapping": {"disable-node-allocatable-mapping": True},
        "no-device-metadata": {"disable-device-metadata": True},
        "everything-set": {"driver-name": "cpu.example.com", "reserved-cpus": "0-1,64-65", "coordination-allowed-uids": [0, 1000], "kubeconfig": "/etc/dra-cpu-kubeconfig/kubeconfig", "expose-pcie-roots": True, "low-latency-tuning": True},
    }.get(mode, {})
    for key, value in expect.items():
        check(mode, dra.get(key) == value, f"dra-plugin.yaml {key} = {dra.get(key)!r}, want {value!r}")
    annotations = one(docs, "DaemonSet")["spec"]["template"]["metadata"].get("annotations", {})
    tolerating = {k: v for k, v in annotations.items() if "tolerate-missing-nri-plugins" in k}
    want = {"example.com/tolerate-missing-nri-plugins": "true"} if mode == "everything-set" else {}
    check(mode, tolerating == want, f"NRI toleration annotations {tolerating}, want {want}")
    if mode == "default":
        check(mode, spec.get("priorityClassName") == "system-node-critical", "not system-node-critical")
        check(mode, {"operator": "Exists"} in spec.get("tolerations", []), "does not tolerate every taint")
        check(mode, "reserved-cpus" not in dra, "an empty reserved-cpus is written")

if problems:
    print("\n".join(problems), file=sys.stderr)
    sys.exit(1)
EOF
echo "check-chart: every mode renders what its values ask for"

# --- config keys are flags of the binaries ---------------------------------------
bin_dir="${DRA_CPU_BIN_DIR:-target/debug}"
if [ ! -x "$bin_dir/dra-plugin" ] || [ ! -x "$bin_dir/nri-plugin" ]; then
  cargo build --quiet -p dra-plugin -p nri-plugin --bins
fi
"$bin_dir/dra-plugin" run --help >"$out/dra-plugin.help" 2>&1 || fail "$bin_dir/dra-plugin run --help failed: $(head -5 "$out/dra-plugin.help")"
"$bin_dir/nri-plugin" --help >"$out/nri-plugin.help" 2>&1 || fail "$bin_dir/nri-plugin --help failed: $(head -5 "$out/nri-plugin.help")"
"$python" - "$out" <<'EOF' || fail "the chart writes config keys or flags the binaries do not have"
import re, sys, yaml

out = sys.argv[1]
problems = []
for mode in ("default", "everything-set"):
    docs = [d for d in yaml.safe_load_all(open(f"{out}/{mode}.yaml")) if d]
    config_map = next(d for d in docs if d["kind"] == "ConfigMap")
    daemon_set = next(d for d in docs if d["kind"] == "DaemonSet")
    containers = {c["name"]: c for c in daemon_set["spec"]["template"]["spec"]["containers"]}
    for binary, file in (("dra-plugin", "dra-plugin.yaml"), ("nri-plugin", "nri-plugin.yaml")):
        flags = set(re.findall(r"--([a-z][a-z0-9-]*)", open(f"{out}/{binary}.help").read()))
        for key in yaml.safe_load(config_map["data"][file]):
            if key not in flags:
                problems.append(f"{mode}: {file} key {key!r} is not a flag of {binary} (flags: {sorted(flags)})")
        for arg in containers[binary]["args"]:
            if arg.startswith("--") and arg[2:].split("=", 1)[0] not in flags:
                problems.append(f"{mode}: {binary} argument {arg!r} is not one of its flags")
if problems:
    print("\n".join(problems), file=sys.stderr)
    sys.exit(1)
EOF
echo "check-chart: every config key and argument the chart writes is a flag of its binary"

# --- bad values fail at install time, naming the value -------------------------------
bad_values=(
  "driverName=Not_A_DNS_Name|/driverName"
  "draPlugin.cpuDeviceMode=single|value must be one of 'auto', 'grouped', 'individual'"
  "draPlugin.groupBy=core|/draPlugin/groupBy"
  "draPlugin.allocationPolicy=spread|/draPlugin/allocationPolicy"
  "reservedCpus=0-a|/reservedCpus"
  "draPlugin.metricsPort=70000|/draPlugin/metricsPort"
  "draPlugin.typo=1|additional properties 'typo' not allowed"
  "draPlugin.kubeconfig=/etc/kubeconfig|additional properties 'kubeconfig' not allowed"
  "draPlugin.kubeconfigSecret=Not_A_Name|/draPlugin/kubeconfigSecret"
  "nri.enabled=maybe|/nri/enabled"
  "nri.pluginIndex=100|/nri/pluginIndex"
  "nri.pluginName=dra-cpu|/nri/pluginName"
  "nri.unsolicitedUpdates=sometimes|/nri/unsolicitedUpdates"
  "nri.requiredByRuntime.tolerationAnnotation=not a key|/nri/requiredByRuntime/tolerationAnnotation"
  "nri.hostCgroups={../kubepods.slice}|/nri/hostCgroups"
  "stateDir=var/lib/dra-cpu|/stateDir"
  "image.digest=latest|/image/digest"
  "nri.metricsPort=9440|the ports must differ"
  "coordinationSocket=/tmp/coordination.sock|must lie under stateDir"
  "securityContext.runAsUser=1000|is not in draPlugin.coordinationAllowedUids"
  "updateStrategy.rollingUpdate.maxSurge=1|/updateStrategy/rollingUpdate/maxSurge"
  "kubeletRootDir=/var/snap/microk8s/common/var/lib/kubelet/with/a/path/long/enough/to/pass/the/limit|past the 107 a Unix socket path may have"
)
for case in "${bad_values[@]}"; do
  setting="${case%%|*}"
  expected="${case#*|}"
  if helm template dra-cpu "$chart" --set "$setting" >"$out/bad.yaml" 2>"$out/bad.log"; then
    fail "--set $setting rendered; it must be refused"
  fi
  grep -qF -- "$expected" "$out/bad.log" ||
    fail "--set $setting was refused without naming the problem ('$expected'): $(cat "$out/bad.log")"
done
echo "check-chart: ${#bad_values[@]} bad values refused with a message naming them"

# --- values the API server would refuse in combination --------------------------------
# privileged: true with the default allowPrivilegeEscalation: false is refused
# by the API server (not by the schemas above): the chart drops the latter.
helm template dra-cpu "$chart" --namespace dra-cpu --set securityContext.privileged=true >"$out/privileged.yaml" 2>"$out/privileged.log" ||
  { cat "$out/privileged.log" >&2; fail "helm template (securityContext.privileged=true)"; }
"$python" - "$out/privileged.yaml" <<'EOF2' || fail "securityContext.privileged=true renders a pair the API server refuses"
import sys, yaml
for doc in yaml.safe_load_all(open(sys.argv[1])):
    if doc and doc.get("kind") == "DaemonSet":
        for c in doc["spec"]["template"]["spec"]["containers"]:
            sc = c.get("securityContext", {})
            assert sc.get("privileged") is True, (c["name"], sc)
            assert "allowPrivilegeEscalation" not in sc, (c["name"], sc)
        break
else:
    sys.exit("no DaemonSet rendered")
EOF2
# A 63-character full name leaves the metrics Service a valid name.
long_name=$(printf 'a%.0s' $(seq 63))
helm template dra-cpu "$chart" --namespace dra-cpu --set fullnameOverride="$long_name",metrics.serviceMonitor.enabled=true >"$out/long-name.yaml" 2>"$out/long-name.log" ||
  { cat "$out/long-name.log" >&2; fail "helm template (a 63-character fullnameOverride)"; }
"$python" - "$out/long-name.yaml" <<'EOF2' || fail "a 63-character fullnameOverride renders a name over 63 characters"
import sys, yaml
services = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d.get("kind") == "Service"]
assert services, "no metrics Service rendered"
for doc in services:
    name = doc["metadata"]["name"]
    assert len(name) <= 63 and name.endswith("-metrics"), name
EOF2
echo "check-chart: privileged: true renders without allowPrivilegeEscalation; a 63-character name leaves the metrics Service's within 63"

# --- monitoring: ServiceMonitor, its Service, the Grafana dashboard -----------------
for nri in true false; do
  monitoring=(--set metrics.serviceMonitor.enabled=true,metrics.dashboard.enabled=true,metrics.serviceMonitor.labels.release=prometheus,nri.enabled=$nri)
  helm lint --quiet --strict "$chart" "${monitoring[@]}" >"$out/lint-monitoring.log" 2>&1 ||
    { cat "$out/lint-monitoring.log" >&2; fail "helm lint (monitoring on, nri.enabled=$nri)"; }
  helm template dra-cpu "$chart" --namespace dra-cpu "${monitoring[@]}" >"$out/monitoring-$nri.yaml" 2>"$out/monitoring.log" ||
    { cat "$out/monitoring.log" >&2; fail "helm template (monitoring on, nri.enabled=$nri)"; }
  # kubernetes-validate knows no ServiceMonitor (it warns and passes it);
  # check-monitoring.py validates that one against the CRD's schema.
  for version in "${schema_versions[@]}"; do
    "$validator" --quiet --strict -k "$version" "$out/monitoring-$nri.yaml" >"$out/validate.log" 2>&1 ||
      { cat "$out/validate.log" >&2; fail "monitoring objects (nri.enabled=$nri) do not validate against Kubernetes $version"; }
  done
  "$python" "$(dirname "$0")/check-monitoring.py" "$out/monitoring-$nri.yaml" tests/schemas/servicemonitor-v1.schema.json "$chart/dashboards/dra-cpu.json" "$nri" ||
    fail "the monitoring objects (nri.enabled=$nri) are not what they must be"
done
if helm template dra-cpu "$chart" --set metrics.serviceMonitor.interval=30seconds >"$out/bad.yaml" 2>"$out/bad.log"; then
  fail "metrics.serviceMonitor.interval=30seconds rendered; it must be refused"
fi
grep -qF "/metrics/serviceMonitor/interval" "$out/bad.log" || fail "a bad scrape interval was refused without naming it: $(cat "$out/bad.log")"
echo "check-chart: ServiceMonitor validates against its CRD schema and selects the metrics Service; the dashboard ConfigMap ships dashboards/dra-cpu.json"

# --- example manifests ------------------------------------------------------------
examples=(docs/examples/*.yaml)
for example in "${examples[@]}"; do
  validate "$example"
done
echo "check-chart: ${#examples[@]} example manifests validate against Kubernetes ${schema_versions[*]}"

# --- the node-scoped ResourceSlice policy, evaluated with a CEL evaluator ------
"$python" "$(dirname "$0")/check-admission-policy.py" "$out/default.yaml" dra-cpu dra-cpu ||
  fail "the ResourceSlice admission policy does not decide as intended"
helm template dra-cpu "$chart" --namespace dra-cpu --set rbac.nodeScopedSlices=false >"$out/no-policy.yaml" 2>"$out/no-policy.log" ||
  { cat "$out/no-policy.log" >&2; fail "helm template (rbac.nodeScopedSlices=false)"; }
if grep -q 'kind: ValidatingAdmissionPolicy' "$out/no-policy.yaml"; then
  fail "rbac.nodeScopedSlices=false still renders the admission policy"
fi
