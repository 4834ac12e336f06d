#!/usr/bin/env python3
"""The report of scripts/perf-pod-start.sh, from the raw data it gathered.

Usage: perf-pod-start-report.py DIR --header TEXT --cpus N --namespace NS

DIR holds pods.txt (one line a pod: kind block name uid seen cgroup-cpus
cgroup inside-cpus), the stamped watches (pods-watch.*, claims-watch.*),
grow.txt (row 5: round claim grown-time), the node's kubelet, kube-scheduler
and containerd logs, and each driver block's dra-plugin and nri-plugin logs
and /metrics before and after. Prints Markdown: the rows, then where the
time of a pod start goes, every milestone read from a component's own log
line or a watch event stamped on arrival.
"""
import argparse
import datetime
import glob
import math
import os
import re
import statistics
import sys

KINDS = {
    "a": "claim (driver)",
    "bd": "no claim (driver block)",
    "c": "Guaranteed, static CPU manager",
    "bs": "no claim (static block)",
}


def klog_time(line, year):
    # I1205 05:46:59.369002 <pid> file:line] ...; klog writes local time.
    m = re.match(r"^[IWE](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d+)", line)
    if not m:
        return None
    mo, d, h, mi, s, frac = m.groups()
    t = datetime.datetime(year, int(mo), int(d), int(h), int(mi), int(s))
    return t.timestamp() + float("0." + frac)


def rfc3339(text):
    # 2026-12-05T05:46:59.736814302Z (containerd) or ...734561Z (tracing)
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?Z", text)
    if not m:
        return None
    t = datetime.datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S").replace(
        tzinfo=datetime.timezone.utc
    )
    return t.timestamp() + float("0." + (m.group(2) or "0"))


def median(xs):
    return statistics.median(xs) if xs else None


def p99(xs):
    if not xs:
        return None
    s = sorted(xs)
    return s[max(0, math.ceil(0.99 * len(s)) - 1)]


def ms(x):
    if x is None:
        return "-"
    if abs(x) >= 0.1:
        return f"{x * 1000:.0f} ms"
    if abs(x) >= 0.001:
        return f"{x * 1000:.1f} ms"
    return f"{x * 1e6:.0f} µs"


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def metric_sum(lines, name, label_filter=""):
    total = 0.0
    for line in lines:
        if line.startswith(name) and label_filter in line:
            rest = line[len(name):]
            if rest.startswith("{") or rest.startswith(" "):
                total += float(line.rsplit(" ", 1)[1])
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--header", default="")
    ap.add_argument("--cpus", type=int, required=True)
    ap.add_argument("--namespace", required=True)
    args = ap.parse_args()
    d, ns = args.dir, args.namespace
    year = datetime.date.today().year

    pods = {}
    for line in read(os.path.join(d, "pods.txt")):
        kind, block, name, uid, seen, cg, cgroup, inside = line.split()
        key = kind if kind in "ac" else "b" + block[0]
        pods[name] = dict(kind=key, block=block, uid=uid, seen=float(seen),
                          cg_cpus=cg, inside=inside, m={})
    if not pods:
        sys.exit("perf-pod-start-report: no pods in " + d)

    # Watches: the pod's ADDED is its creation; a claim's ADDED and first
    # allocated state.
    for path in glob.glob(os.path.join(d, "pods-watch.*")):
        for line in read(path):
            f = line.split()
            if len(f) >= 3 and f[1] == "ADDED" and f[2] in pods:
                pods[f[2]]["m"].setdefault("created", float(f[0]))
    claim_of = {}
    for path in glob.glob(os.path.join(d, "claims-watch.*")):
        for line in read(path):
            f = line.split()
            if len(f) < 4:
                continue
            pod = f[2].rsplit("-cpus-", 1)[0]
            if pod not in pods:
                continue
            claim_of[f[2]] = pod
            m = pods[pod]["m"]
            if f[1] == "ADDED":
                m.setdefault("claim created", float(f[0]))
            if f[3] != "<none>":
                m.setdefault("claim allocated", float(f[0]))

    def podref(line, pattern):
        m = re.search(pattern, line)
        return m.group(1) if m and m.group(1) in pods else None

    for line in read(os.path.join(d, "kube-scheduler.log")):
        if '"Attempting to schedule pod"' in line:
            p = podref(line, r'pod="' + ns + r'/([^"]+)"')
            if p:
                pods[p]["m"].setdefault("scheduling", klog_time(line, year))
        elif '"Successfully bound pod to node"' in line:
            p = podref(line, r'pod="' + ns + r'/([^"]+)"')
            if p:
                pods[p]["m"].setdefault("bound", klog_time(line, year))
    for line in read(os.path.join(d, "kubelet.log")):
        if '"SyncLoop ADD"' in line:
            p = podref(line, r'pods=\["' + ns + r'/([^"]+)"\]')
            if p:
                pods[p]["m"].setdefault("kubelet saw it", klog_time(line, year))
        elif '"All volumes are attached and mounted for pod"' in line:
            p = podref(line, r'pod="' + ns + r'/([^"]+)"')
            if p:
                pods[p]["m"].setdefault("volumes mounted", klog_time(line, year))
        elif '"Processing resource"' in line and "dra-manager" in line:
            p = podref(line, r'pod="' + ns + r'/([^"]+)"')
            if p:
                pods[p]["m"].setdefault("kubelet DRA prepare", klog_time(line, year))

    sandbox_pod, container_pod, update_requests = {}, {}, []
    for line in read(os.path.join(d, "containerd.log")):
        tm = re.match(r'time="([^"]+)"', line)
        if not tm or "level=info" not in line:
            continue
        t = rfc3339(tm.group(1))
        if "requested container updates" in line:
            update_requests.append(t)
            continue
        m = re.search(r'RunPodSandbox for name:\\"([^\\]+)\\" uid:\\"[^\\]+\\" namespace:\\"' + ns + r'\\"(.*)', line)
        if m and m.group(1) in pods:
            p = m.group(1)
            r = re.search(r'returns sandbox id \\"([0-9a-f]+)\\"', m.group(2))
            if r:
                sandbox_pod[r.group(1)] = p
                pods[p]["m"].setdefault("sandbox ready", t)
            else:
                pods[p]["m"].setdefault("RunPodSandbox", t)
            continue
        m = re.search(r'CreateContainer within sandbox \\"([0-9a-f]+)\\" for (container )?name:\\"app\\"(.*)', line)
        if m and m.group(1) in sandbox_pod:
            p = sandbox_pod[m.group(1)]
            r = re.search(r'returns container id \\"([0-9a-f]+)\\"', m.group(3))
            if r:
                container_pod[r.group(1)] = p
                pods[p]["m"].setdefault("created by containerd", t)
            else:
                pods[p]["m"].setdefault("CreateContainer", t)
            continue
        m = re.search(r'StartContainer for \\"([0-9a-f]+)\\"( returns successfully)?', line)
        if m and m.group(1) in container_pod:
            p = container_pod[m.group(1)]
            pods[p]["m"].setdefault("started by containerd" if m.group(2) else "StartContainer", t)

    prepared_at, unprepared_at, claim_uid = {}, {}, {}
    nri_unprepared, nri_sent = {}, []
    for path in sorted(glob.glob(os.path.join(d, "dra-plugin.*.log"))):
        for line in read(path):
            m = re.search(r"claim (un)?prepared claim=" + ns + r"/(\S+) \(([0-9a-f-]+)\)", line)
            if m:
                t = rfc3339(line.split()[0])
                claim_uid[m.group(2)] = m.group(3)
                (unprepared_at if m.group(1) else prepared_at)[m.group(2)] = t
    for path in sorted(glob.glob(os.path.join(d, "nri-plugin.*.log"))):
        for line in read(path):
            t = rfc3339(line.split()[0]) if line else None
            m = re.search(r"create_container\{container=\S+ name=app pod=(\S+) namespace=" + ns + r" .*container placed", line)
            if m and m.group(1) in pods:
                pods[m.group(1)]["m"].setdefault("nri-plugin placed it", t)
            m = re.search(r"nri_plugin::enforcer: claim unprepared claim=([0-9a-f-]+)", line)
            if m:
                nri_unprepared[m.group(1)] = t
            if 'pool change sent as an unsolicited update why="unprepare"' in line:
                nri_sent.append(t)
    for claim, pod in claim_of.items():
        if claim in prepared_at:
            pods[pod]["m"].setdefault("dra-plugin prepared", prepared_at[claim])
    for p in pods.values():
        p["m"]["running, cpuset read"] = p["seen"]

    # The checks: the cgroup and the process inside agree; claim and
    # Guaranteed pods got exactly N CPUs.
    def ncpus(text):
        n = 0
        for part in text.split(","):
            if "-" in part:
                lo, hi = part.split("-")
                n += int(hi) - int(lo) + 1
            elif part:
                n += 1
        return n

    bad = []
    for name, p in pods.items():
        if p["cg_cpus"] != p["inside"]:
            bad.append(f"{name}: cgroup {p['cg_cpus']}, inside {p['inside']}")
        if p["kind"] in ("a", "c") and ncpus(p["cg_cpus"]) != args.cpus:
            bad.append(f"{name}: {p['cg_cpus']} is not {args.cpus} CPUs")
        if "created" not in p["m"]:
            bad.append(f"{name}: no ADDED event on the watch")

    totals = {k: [] for k in KINDS}
    cpusets = {k: set() for k in KINDS}
    for p in pods.values():
        if "created" in p["m"]:
            totals[p["kind"]].append(p["seen"] - p["m"]["created"])
        cpusets[p["kind"]].add(p["cg_cpus"])

    out = []
    out.append(f"Pod start on the real node: {args.header}")
    out.append("")
    out.append("| # | what | measured | baseline | ratio |")
    out.append("|---|---|---|---|---|")

    def cell(k):
        xs = totals[k]
        return f"median {ms(median(xs))} p99 {ms(p99(xs))} (n={len(xs)})"

    def ratio(a, b):
        if not totals[a] or not totals[b]:
            return "-"
        return f"{median(totals[a]) / median(totals[b]):.2f}×"

    out.append(f"| 8 | pod start, claim of {args.cpus} exclusive CPU(s) (our driver) | {cell('a')} | same pod, no claim, interleaved: {cell('bd')} | {ratio('a', 'bd')} |")
    out.append(f"| 8b | pod start, Guaranteed pod of {args.cpus} integer CPU(s), kubelet's static CPU manager (no driver) | {cell('c')} | same pod as 8's baseline, no claim, interleaved: {cell('bs')} | {ratio('c', 'bs')} |")
    out.append(f"| 8c | row 8 against row 8b (alternating blocks) | {cell('a')} | {cell('c')} | {ratio('a', 'c')} |")

    grow = []
    for line in read(os.path.join(d, "grow.txt")):
        i, claim, t = line.split()
        if claim in unprepared_at:
            grow.append((float(t) - unprepared_at[claim], claim))
    if grow:
        xs = [g for g, _ in grow]
        out.append(f"| 5b | NodeUnprepareResources return (dra-plugin's \"claim unprepared\") → running shared container's cgroup shows the grown pool, no container event | median {ms(median(xs))} p99 {ms(p99(xs))} (n={len(xs)}) | - | - |")
    out.append("")
    out.append("cpusets read back (cgroup; the process inside agreed on every pod): "
               + "; ".join(f"{KINDS[k]}: {', '.join(sorted(v))}" for k, v in cpusets.items() if v))
    if bad:
        out.append("")
        out.append("**Checks failed:** " + "; ".join(bad))

    # Where the time goes: each milestone's median from the pod's creation,
    # and the median step from the milestone before it.
    order = ["created", "scheduling", "claim created", "claim allocated", "bound",
             "kubelet saw it", "volumes mounted", "kubelet DRA prepare", "dra-plugin prepared",
             "RunPodSandbox", "sandbox ready", "CreateContainer", "nri-plugin placed it",
             "created by containerd", "StartContainer", "started by containerd",
             "running, cpuset read"]
    out.append("")
    out.append("Where the time goes: median time from the pod's creation to each milestone "
               "(a log line's own time, or a watch event's arrival)")
    out.append("")
    out.append("| milestone | source | " + " | ".join(KINDS[k] for k in KINDS) + " |")
    out.append("|---|---|" + "---|" * len(KINDS))
    sources = {
        "created": "pods watch, ADDED",
        "claim created": "claims watch, ADDED (ResourceClaim controller)",
        "scheduling": "kube-scheduler -v=3 \"Attempting to schedule pod\" (first)",
        "claim allocated": "claims watch, allocation (scheduler)",
        "bound": "kube-scheduler \"Successfully bound pod to node\"",
        "kubelet saw it": "kubelet \"SyncLoop ADD\"",
        "volumes mounted": "kubelet -v=3 \"All volumes are attached and mounted\"",
        "kubelet DRA prepare": "kubelet -v=3 dra-manager \"Processing resource\"",
        "dra-plugin prepared": "dra-plugin \"claim prepared\"",
        "RunPodSandbox": "containerd \"RunPodSandbox for\"",
        "sandbox ready": "containerd \"returns sandbox id\"",
        "CreateContainer": "containerd \"CreateContainer within sandbox\"",
        "nri-plugin placed it": "nri-plugin \"container placed\"",
        "created by containerd": "containerd \"returns container id\"",
        "StartContainer": "containerd \"StartContainer for\"",
        "started by containerd": "containerd \"returns successfully\"",
        "running, cpuset read": "cgroup poll (2 ms): process past its first command",
    }
    for mname in order:
        cells = []
        for k in KINDS:
            group = [p for p in pods.values() if p["kind"] == k and "created" in p["m"]]
            at = [p["m"][mname] - p["m"]["created"] for p in group if mname in p["m"]]
            if not at:
                cells.append("-")
                continue
            cell_text = ms(median(at))
            if len(at) != len(group):
                cell_text += f" [{len(at)} of {len(group)}]"
            cells.append(cell_text)
        out.append(f"| {mname} | {sources[mname]} | " + " | ".join(cells) + " |")

    # The same as steps, each pod's own, between milestones every kind has
    # (the claim's work falls between creation and binding, and between the
    # volumes and the sandbox).
    steps = [("created", "bound"), ("bound", "kubelet saw it"), ("kubelet saw it", "volumes mounted"),
             ("volumes mounted", "RunPodSandbox"), ("RunPodSandbox", "sandbox ready"),
             ("sandbox ready", "created by containerd"), ("created by containerd", "started by containerd"),
             ("started by containerd", "running, cpuset read"), ("created", "running, cpuset read")]
    out.append("")
    out.append("The same as steps: each pod's time from one milestone to the next, median")
    out.append("")
    out.append("| step | " + " | ".join(KINDS[k] for k in KINDS) + " |")
    out.append("|---|" + "---|" * len(KINDS))
    for first, second in steps:
        cells = []
        for k in KINDS:
            xs = [p["m"][second] - p["m"][first] for p in pods.values()
                  if p["kind"] == k and first in p["m"] and second in p["m"]]
            cells.append(ms(median(xs)))
        out.append(f"| {first} → {second} | " + " | ".join(cells) + " |")

    # Metrics: the processes' own time per call, mean over the driver blocks.
    def mean_delta(prefix, name, label=""):
        s = c = 0.0
        for before in glob.glob(os.path.join(d, prefix + ".*.before")):
            after = before[: -len(".before")] + ".after"
            b, a = read(before), read(after)
            s += metric_sum(a, name + "_sum", label) - metric_sum(b, name + "_sum", label)
            c += metric_sum(a, name + "_count", label) - metric_sum(b, name + "_count", label)
        return (s / c, int(c)) if c else (None, 0)

    prep, n_prep = mean_delta("dra-metrics", "dra_cpu_prepare_duration_seconds")
    call, n_call = mean_delta("dra-metrics", "dra_cpu_prepare_claim_duration_seconds")
    nri_ex, n_ex = mean_delta("nri-metrics", "dra_cpu_nri_create_container_duration_seconds", 'cpu_allocation_mode="exclusive"')
    nri_sh, n_sh = mean_delta("nri-metrics", "dra_cpu_nri_create_container_duration_seconds", 'cpu_allocation_mode="shared"')
    out.append("")
    out.append(f"From the processes' /metrics over the driver blocks (mean per call): dra-plugin's "
               f"prepare of a claim {ms(call)} (n={n_call}, dra_cpu_prepare_claim_duration_seconds: "
               f"the ResourceClaim GET included), of which the decision, store fsync and CDI write "
               f"{ms(prep)} (n={n_prep}, dra_cpu_prepare_duration_seconds); nri-plugin CreateContainer {ms(nri_ex)} exclusive (n={n_ex}), "
               f"{ms(nri_sh)} shared (n={n_sh}) (dra_cpu_nri_create_container_duration_seconds).")

    if grow:
        learn, sent, received = [], [], []
        for g, claim in grow:
            uid = claim_uid.get(claim)
            t0 = unprepared_at[claim]
            if uid in nri_unprepared:
                learn.append(nri_unprepared[uid] - t0)
                got = [t for t in update_requests if t >= nri_unprepared[uid]]
                if got:
                    received.append(min(got) - t0)
                after = [t for t in nri_sent if t is not None and t >= nri_unprepared[uid]]
                if after:
                    sent.append(min(after) - t0)
        out.append("")
        out.append(f"Row 5b, from dra-plugin's \"claim unprepared\" (medians, n={len(grow)}): nri-plugin's "
                   f"\"claim unprepared\" (the Watch event) +{ms(median(learn))}; containerd's "
                   f"\"plugin requested container updates\" +{ms(median(received))}; nri-plugin's \"pool change sent "
                   f"as an unsolicited update\" +{ms(median(sent))}; the shared cgroup grown "
                   f"+{ms(median([g for g, _ in grow]))} (cgroup polled every 1 ms).")
    print("\n".join(out))
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    main()
