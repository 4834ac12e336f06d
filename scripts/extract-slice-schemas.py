#!/usr/bin/env python3
"""Writes the ResourceSlice schema of each Kubernetes version the fake API
server models (tests/src/apiserver/schemas/resourceslice-v1.<minor>.json),
taken from the real OpenAPI schemas shipped by the PyPI package
kubernetes-validate: every definition reachable from
io.k8s.api.resource.v1.ResourceSlice, with descriptions left out.

Run with --check to compare the committed files with the installed package
instead of writing them (exit 1 on a difference)."""
import json
import os
import sys

import kubernetes_validate

VERSIONS = ["1.34", "1.35", "1.36", "1.37"]
ROOT = "io.k8s.api.resource.v1.ResourceSlice"
KEEP = ("type", "properties", "items", "additionalProperties", "$ref", "format", "allOf")


def schema_dir(version):
    base = os.path.join(os.path.dirname(kubernetes_validate.__file__), "kubernetes-json-schema")
    return os.path.join(base, f"v{version}.0-local-strict")


def reduce(node, refs):
    if isinstance(node, dict):
        out = {}
        for key in KEEP:
            if key not in node:
                continue
            value = node[key]
            if key == "$ref":
                name = value.rsplit("/", 1)[-1]
                refs.append(name)
                out[key] = name
            elif key == "properties":
                out[key] = {k: reduce(v, refs) for k, v in sorted(value.items())}
            elif key in ("items", "additionalProperties") and isinstance(value, dict):
                out[key] = reduce(value, refs)
            elif key == "allOf":
                out[key] = [reduce(v, refs) for v in value]
            else:
                out[key] = value
        return out
    return node


def extract(version):
    with open(os.path.join(schema_dir(version), "_definitions.json")) as f:
        defs = json.load(f)["$defs"]
    out, todo = {}, [ROOT]
    while todo:
        name = todo.pop()
        if name in out:
            continue
        refs = []
        out[name] = reduce(defs[name], refs)
        todo.extend(refs)
    return {"source": f"kubernetes-validate {kubernetes_validate.__version__ if hasattr(kubernetes_validate, '__version__') else ''} v{version}.0-local-strict/_definitions.json".replace("  ", " "),
            "root": ROOT, "definitions": dict(sorted(out.items()))}


def main():
    check = "--check" in sys.argv
    target = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "src", "apiserver", "schemas")
    failed = False
    for version in VERSIONS:
        text = json.dumps(extract(version)["definitions"], indent=1, sort_keys=True) + "\n"
        path = os.path.join(target, f"resourceslice-v{version}.json")
        if check:
            with open(path) as f:
                if f.read() != text:
                    print(f"{path} differs from kubernetes-validate's v{version} schema", file=sys.stderr)
                    failed = True
        else:
            with open(path, "w") as f:
                f.write(text)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
