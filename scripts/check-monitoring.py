#!/usr/bin/env python3
"""Checks the chart's monitoring objects, rendered with them switched on.

Usage: check-monitoring.py RENDERED.yaml SERVICEMONITOR_SCHEMA.json DASHBOARD.json NRI_ENABLED

- The ServiceMonitor validates against the vendored openAPIV3Schema of the
  CRD (tests/schemas/servicemonitor-v1.schema.json). The API server prunes
  fields a structural schema does not declare, so a typo in the chart would
  vanish silently; here every object schema that lists properties is closed
  (additionalProperties: false) so such a typo is an error.
- The ServiceMonitor selects the chart's metrics Service (labels and
  namespace), every endpoint port is a port of that Service, and each
  Service port targets a named container port of the DaemonSet.
- The dashboard ConfigMap carries grafana_dashboard: "1" and exactly the
  chart's dashboards/dra-cpu.json.
"""
import copy
import json
import sys

import jsonschema
import yaml


def closed(schema):
    """The schema with every object that lists properties closed."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    schema.pop("$comment", None)
    return schema


def schema_errors(schema, obj):
    validator = jsonschema.Draft7Validator(schema)
    return [
        f"{'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
        for e in validator.iter_errors(obj)
    ]


def main():
    rendered, schema_path, dashboard_path, nri_enabled = sys.argv[1:5]
    nri_enabled = nri_enabled == "true"
    docs = [d for d in yaml.safe_load_all(open(rendered)) if d]
    schema = closed(json.load(open(schema_path)))
    problems = []

    def one(kind, name_suffix=""):
        found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
        if len(found) != 1:
            problems.append(f"{len(found)} {kind} objects named *{name_suffix}, want 1")
            return None
        return found[0]

    monitor = one("ServiceMonitor")
    service = one("Service", "-metrics")
    daemon_set = one("DaemonSet")
    config_map = one("ConfigMap", "-dashboard")
    if problems:
        return problems

    problems += [f"ServiceMonitor {e}" for e in schema_errors(schema, monitor)]

    # The validator itself must refuse what the API server would prune.
    typo = copy.deepcopy(monitor)
    typo["spec"]["endpoints"][0]["intervall"] = "30s"
    if not schema_errors(schema, typo):
        problems.append("the closed schema accepts an unknown endpoint field")

    spec = monitor["spec"]
    if spec["namespaceSelector"].get("matchNames") != [service["metadata"]["namespace"]]:
        problems.append("the ServiceMonitor does not look in the Service's namespace")
    labels = service["metadata"]["labels"]
    for key, value in spec["selector"]["matchLabels"].items():
        if labels.get(key) != value:
            problems.append(f"the ServiceMonitor selects {key}={value}, the Service has {labels.get(key)!r}")
    service_ports = {p["name"]: p for p in service["spec"]["ports"]}
    want_ports = ["dra-metrics", "nri-metrics"] if nri_enabled else ["dra-metrics"]
    if sorted(service_ports) != sorted(want_ports):
        problems.append(f"Service ports {sorted(service_ports)}, want {want_ports}")
    endpoint_ports = [e["port"] for e in spec["endpoints"]]
    if sorted(endpoint_ports) != sorted(want_ports):
        problems.append(f"ServiceMonitor endpoints {endpoint_ports}, want {want_ports}")
    for e in spec["endpoints"]:
        if e.get("path") != "/metrics":
            problems.append(f"endpoint {e['port']} scrapes {e.get('path')}")
        if not any(r.get("targetLabel") == "node" for r in e.get("relabelings", [])):
            problems.append(f"endpoint {e['port']} does not label series with their node")
    pod = daemon_set["spec"]["template"]
    container_ports = {
        p["name"]: p["containerPort"]
        for c in pod["spec"]["containers"]
        for p in c.get("ports", [])
    }
    for name, port in service_ports.items():
        if container_ports.get(port["targetPort"]) != port["port"]:
            problems.append(f"Service port {name} targets {port['targetPort']}, which no container serves on {port['port']}")
    selector = service["spec"]["selector"]
    pod_labels = pod["metadata"]["labels"]
    if any(pod_labels.get(k) != v for k, v in selector.items()):
        problems.append(f"the Service selects {selector}, the pods have {pod_labels}")

    if config_map["metadata"]["labels"].get("grafana_dashboard") != "1":
        problems.append("the dashboard ConfigMap lacks grafana_dashboard: \"1\"")
    shipped = json.loads(config_map["data"]["dra-cpu.json"])
    if shipped != json.load(open(dashboard_path)):
        problems.append("the dashboard ConfigMap differs from dashboards/dra-cpu.json")
    return problems


if __name__ == "__main__":
    problems = main()
    if problems:
        print("\n".join(problems), file=sys.stderr)
        sys.exit(1)
