#!/usr/bin/env python3
"""Evaluates the chart's ValidatingAdmissionPolicy for ResourceSlices with a
real CEL evaluator (PyPI cel-python) the way the API server does: match
conditions first, then the variables, then the validations, for requests of
the driver's service account on its own node's slices, on another node's
slices, without a node in its token, and for another user.

Usage: check-admission-policy.py RENDERED.yaml NAMESPACE SERVICE_ACCOUNT
Exits 1 with the failing cases listed."""
import sys

import celpy
import yaml

NODE_EXTRA = "authentication.kubernetes.io/node-name"


def load_policy(path):
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    policies = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"]
    bindings = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    if len(policies) != 1 or len(bindings) != 1:
        sys.exit(f"want one policy and one binding, got {len(policies)} and {len(bindings)}")
    policy, binding = policies[0], bindings[0]
    if binding["spec"]["policyName"] != policy["metadata"]["name"]:
        sys.exit("the binding names another policy")
    if binding["spec"]["validationActions"] != ["Deny"]:
        sys.exit("the binding does not deny")
    return policy


def evaluate(policy, request, obj, old):
    """'skip' (no match), 'allow', or the deny message."""
    env = celpy.Environment()
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    if not any(request["operation"] in r["operations"] and "resourceslices" in r["resources"] for r in rules):
        return "skip"
    activation = {
        "request": celpy.json_to_cel(request),
        "object": celpy.json_to_cel(obj),
        "oldObject": celpy.json_to_cel(old),
    }
    for condition in policy["spec"].get("matchConditions", []):
        if not env.program(env.compile(condition["expression"])).evaluate(activation):
            return "skip"
    variables = {}
    for variable in policy["spec"].get("variables", []):
        activation["variables"] = celpy.json_to_cel(variables)
        value = env.program(env.compile(variable["expression"])).evaluate(activation)
        variables[variable["name"]] = str(value)
    activation["variables"] = celpy.json_to_cel(variables)
    for validation in policy["spec"]["validations"]:
        if not env.program(env.compile(validation["expression"])).evaluate(activation):
            message = env.program(env.compile(validation["messageExpression"])).evaluate(activation)
            return str(message)
    return "allow"


def main():
    path, namespace, account = sys.argv[1:4]
    policy = load_policy(path)
    driver = f"system:serviceaccount:{namespace}:{account}"

    def request(operation, user=driver, node="node-a"):
        extra = {NODE_EXTRA: [node]} if node else {}
        return {"operation": operation, "userInfo": {"username": user, "extra": extra}}

    def slice_on(node):
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": f"{node}-dra.cpu-0"},
                "spec": {"driver": "dra.cpu", "nodeName": node, "pool": {"name": node}}}

    own, other = slice_on("node-a"), slice_on("node-b")
    cases = [
        ("create own", request("CREATE"), own, None, "allow"),
        ("update own", request("UPDATE"), own, own, "allow"),
        ("delete own", request("DELETE"), None, own, "allow"),
        ("create another node's", request("CREATE"), other, None, "deny"),
        ("update another node's", request("UPDATE"), other, other, "deny"),
        ("move own to another node", request("UPDATE"), other, own, "deny"),
        ("delete another node's", request("DELETE"), None, other, "deny"),
        ("token without a node", request("CREATE", node=None), own, None, "deny"),
        ("another user", request("CREATE", user="system:serviceaccount:x:y"), other, None, "skip"),
        ("scheduler-like reader", request("CONNECT"), own, None, "skip"),
    ]
    failures = []
    for name, req, obj, old, want in cases:
        got = evaluate(policy, req, obj, old)
        kind = got if got in ("allow", "skip") else "deny"
        if kind != want:
            failures.append(f"{name}: want {want}, got {got}")
        elif kind == "deny" and "own node" not in got:
            failures.append(f"{name}: the message does not say why: {got}")
    if failures:
        print("\n".join(failures), file=sys.stderr)
        sys.exit(1)
    print(f"check-admission-policy: {len(cases)} requests evaluated with cel-python as expected")


if __name__ == "__main__":
    main()
