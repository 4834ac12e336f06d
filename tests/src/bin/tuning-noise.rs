//! What claim tuning buys a busy workload: interrupts on the claim's CPUs
//! and involuntary context switches of a busy loop pinned there, over a
//! fixed time, for the same claim untuned, with `irqs: isolate` (and the
//! idle bound where the kernel has one), and with `loadBalancing: off` on
//! top where the node offers isolated partitions, alternated round by
//! round in one run while the node does disk and console I/O.
//!
//! Run it through `scripts/tuning-noise.sh` (inside the VM node, whose
//! interrupts can be moved without harming other work); it needs root.
//!
//!   tuning-noise [--rounds N] [--seconds S] [--irq-name NAME] [--host-hogs N] [--trace-ipis]
//!
//! `--trace-ipis` records the kernel's `ipi:ipi_send_cpu` and
//! `ipi:ipi_send_cpumask` events aimed at the claim's CPUs during each
//! measurement and prints their most frequent senders (the call site, the
//! function the IPI runs, the sending task), to say where the claim's
//! function-call IPIs come from.
//!
//! `--host-hogs N` runs N busy loops (nice 19) in the node's root cgroup,
//! not in any container and not pinned, as work a node has outside its pods (processes
//! no `--host-cgroups` confines): the scheduler may run them on any CPU their
//! cpuset allows, which an isolated partition (`loadBalancing: off`) takes
//! the claim's CPUs out of.
//!
//! Interrupts named NAME in `/proc/interrupts` (default `ttyS0`, the
//! console the load writes to) are placed on the CPUs the claim will get
//! before each round, as a driver's spread or an irqbalance leaves some
//! interrupt on any CPU of a real node; a tuned claim moves them off, an
//! untuned one takes them.

// A measurement tool: a panic stops it with the reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use anyhow::{bail, Context};
use dra_cpu_tests::cri::spec::ContainerSpec;
use dra_cpu_tests::interrupts::{involuntary_switches, parse_interrupts, InterruptCounts};
use dra_cpu_tests::node::layout::NodeOptions;
use dra_cpu_tests::node::pods::PodIdentity;
use dra_cpu_tests::node::Node;
use serde_json::json;
use shared_state::CpuSet;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Device and console I/O in the background, so that device interrupts
/// arrive while a round measures. Confined to `cpus` (away from the
/// claim's), so that only where the interrupts are routed differs.
struct Load(Vec<Child>);

impl Load {
    fn start(cpus: &str) -> anyhow::Result<Load> {
        let scripts = [
            // Disk: write and sync, over and over (virtio-blk interrupts).
            "while :; do dd if=/dev/zero of=/var/tmp/noise-load bs=64k count=64 conv=fsync 2>/dev/null; done",
            // Serial console output (the UART's interrupt).
            "while :; do echo tuning-noise load > /dev/console; sleep 0.01; done",
        ];
        let mut children = Vec::new();
        for script in scripts {
            children.push(
                Command::new("taskset")
                    .args(["-c", cpus, "sh", "-c", script])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .context("starting background I/O")?,
            );
        }
        Ok(Load(children))
    }
}

impl Load {
    /// `n` unpinned busy loops, at the lowest priority: background work
    /// that takes what CPU time is left, so the node's own processes
    /// (containerd, the driver) still answer in time.
    fn hogs(n: usize) -> anyhow::Result<Load> {
        let mut children = Vec::new();
        for _ in 0..n {
            children.push(
                Command::new("nice")
                    .args(["-n", "19", "sh", "-c", "while :; do :; done"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .context("starting a host busy loop")?,
            );
        }
        Ok(Load(children))
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file("/var/tmp/noise-load");
    }
}

fn interrupts() -> anyhow::Result<InterruptCounts> {
    Ok(parse_interrupts(
        &std::fs::read_to_string("/proc/interrupts").context("/proc/interrupts")?,
    ))
}

fn switches(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("/proc/{pid}/status"))?;
    involuntary_switches(&status).context("no nonvoluntary_ctxt_switches")
}

/// What a claim asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Untuned,
    /// `irqs: isolate` and the idle bound (where the kernel has one).
    Quiet,
    /// That and `loadBalancing: off`.
    Isolated,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Untuned => "untuned",
            Variant::Quiet => "quiet",
            Variant::Isolated => "isolated",
        }
    }

    fn row(self, idle: bool) -> &'static str {
        match (self, idle) {
            (Variant::Untuned, _) => "untuned",
            (Variant::Quiet, true) => "`irqs: isolate`, `idle: {maxLatencyMicroseconds: 0}`",
            (Variant::Quiet, false) => "`irqs: isolate`",
            (Variant::Isolated, true) => {
                "`irqs: isolate`, `idle: {maxLatencyMicroseconds: 0}`, `loadBalancing: \"off\"`"
            }
            (Variant::Isolated, false) => "`irqs: isolate`, `loadBalancing: \"off\"`",
        }
    }

    fn tuning(self, idle: bool) -> serde_json::Value {
        let mut tuning = match self {
            Variant::Untuned => return json!({"irqs": "default"}),
            Variant::Quiet | Variant::Isolated => json!({"irqs": "isolate"}),
        };
        if idle {
            tuning["idle"] = json!({"maxLatencyMicroseconds": 0});
        }
        if self == Variant::Isolated {
            tuning["loadBalancing"] = json!("off");
        }
        tuning
    }
}

/// Whether this kernel has a per-CPU idle bound.
fn has_idle_bound() -> bool {
    std::path::Path::new("/sys/devices/system/cpu/cpu0/power/pm_qos_resume_latency_us").exists()
}

/// The kernel's IPI events aimed at a claim's CPUs, recorded by tracefs
/// while it is alive.
struct IpiTrace {
    dir: std::path::PathBuf,
    cpus: CpuSet,
}

impl IpiTrace {
    const EVENTS: [&'static str; 2] = ["ipi_send_cpu", "ipi_send_cpumask"];

    fn start(cpus: &CpuSet) -> anyhow::Result<IpiTrace> {
        let dir = std::path::PathBuf::from("/sys/kernel/tracing");
        if !dir.join("trace").exists() {
            let status = Command::new("mount")
                .args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"])
                .status()
                .context("mounting tracefs")?;
            if !status.success() {
                bail!("mounting tracefs at /sys/kernel/tracing failed");
            }
        }
        let list = cpus.to_cpulist();
        let filters = [
            cpus.iter()
                .map(|c| format!("cpu == {c}"))
                .collect::<Vec<_>>()
                .join(" || "),
            format!("cpumask & CPUS{{{list}}}"),
        ];
        std::fs::write(dir.join("buffer_size_kb"), "8192").context("trace buffer size")?;
        std::fs::write(dir.join("trace"), "").context("clearing the trace")?;
        for (event, filter) in Self::EVENTS.iter().zip(filters) {
            let event_dir = dir.join("events/ipi").join(event);
            // A kernel refusing the filter still records the event,
            // unfiltered: the summary keeps the claim's CPUs only.
            if let Err(e) = std::fs::write(event_dir.join("filter"), &filter) {
                println!("  (tracefs refused the filter {filter:?} of {event}: {e})");
            }
            std::fs::write(event_dir.join("enable"), "1")
                .with_context(|| format!("enabling ipi:{event}"))?;
        }
        // What each function-call IPI runs, on the CPU that runs it.
        if let Err(e) = std::fs::write(dir.join("events/csd/csd_function_entry/enable"), "1") {
            println!("  (no csd:csd_function_entry event: {e})");
        }
        std::fs::write(dir.join("tracing_on"), "1").context("tracing on")?;
        Ok(IpiTrace {
            dir,
            cpus: cpus.clone(),
        })
    }

    /// The recorded events, counted by (call site, callback, sender).
    fn summary(&self) -> anyhow::Result<Vec<(u64, String)>> {
        std::fs::write(self.dir.join("tracing_on"), "0").context("tracing off")?;
        let text = std::fs::read_to_string(self.dir.join("trace")).context("reading the trace")?;
        let mut counts: std::collections::BTreeMap<String, u64> = Default::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            if let Some((head, fields)) = line.split_once(": csd_function_entry: ") {
                // `<comm>-<pid> [NNN] ...`: the CPU that ran it.
                let ran_on = head
                    .split_once('[')
                    .and_then(|(_, rest)| rest.split_once(']'))
                    .and_then(|(cpu, _)| cpu.trim().parse::<u32>().ok());
                if ran_on.is_some_and(|c| self.cpus.contains(c)) {
                    let func = fields
                        .split_whitespace()
                        .find_map(|f| f.strip_prefix("func="))
                        .unwrap_or("?")
                        .trim_end_matches(',');
                    let func = func.split('+').next().unwrap_or(func);
                    *counts
                        .entry(format!("ran {func} on the claim's CPUs"))
                        .or_default() += 1;
                }
                continue;
            }
            let Some((head, fields)) = line.split_once(": ipi_send_cpu") else {
                continue;
            };
            // `<comm>-<pid> [cpu] flags timestamp`: the sender's name.
            let sender = head
                .split_whitespace()
                .next()
                .and_then(|task| task.rsplit_once('-').map(|(comm, _)| comm))
                .unwrap_or("?");
            let field = |name: &str| {
                fields
                    .split_whitespace()
                    .find_map(|f| f.strip_prefix(name))
                    .map(|v| v.split('+').next().unwrap_or(v).to_string())
                    .unwrap_or_default()
            };
            let target = if fields.starts_with("mask") {
                CpuSet::parse_cpulist(&field("cpumask=")).unwrap_or_default()
            } else {
                CpuSet::parse_cpulist(&field("cpu=")).unwrap_or_default()
            };
            if target.is_disjoint(&self.cpus) {
                continue;
            }
            let key = format!(
                "callsite={} callback={} from {sender}",
                field("callsite="),
                field("callback=")
            );
            *counts.entry(key).or_default() += 1;
        }
        let mut sorted: Vec<(u64, String)> = counts.into_iter().map(|(k, n)| (n, k)).collect();
        sorted.sort_by(|a, b| b.cmp(a));
        Ok(sorted)
    }
}

impl Drop for IpiTrace {
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("tracing_on"), "0");
        for event in Self::EVENTS {
            let event_dir = self.dir.join("events/ipi").join(event);
            let _ = std::fs::write(event_dir.join("enable"), "0");
            let _ = std::fs::write(event_dir.join("filter"), "0");
        }
        let _ = std::fs::write(self.dir.join("events/csd/csd_function_entry/enable"), "0");
    }
}

/// One measurement of one variant.
struct Sample {
    variant: Variant,
    device_irqs: u64,
    all_irqs: u64,
    switches: u64,
}

/// The interrupts whose `/proc/interrupts` line ends with `name`.
fn irqs_named(name: &str) -> anyhow::Result<Vec<u32>> {
    let text = std::fs::read_to_string("/proc/interrupts").context("/proc/interrupts")?;
    Ok(text
        .lines()
        .filter(|line| line.split_whitespace().last() == Some(name))
        .filter_map(|line| line.split_once(':')?.0.trim().parse().ok())
        .collect())
}

fn place_irqs(irqs: &[u32], cpus: &CpuSet) -> anyhow::Result<()> {
    for irq in irqs {
        std::fs::write(
            format!("/proc/irq/{irq}/smp_affinity_list"),
            cpus.to_cpulist(),
        )
        .with_context(|| format!("placing interrupt {irq} on {cpus}"))?;
    }
    Ok(())
}

async fn measure(
    node: &mut Node,
    round: usize,
    variant: Variant,
    seconds: u64,
    placed: (&[u32], &CpuSet),
    trace_ipis: bool,
) -> anyhow::Result<Sample> {
    // The device's interrupt is on the claim's CPUs before the claim.
    let (irqs, claim_cpus) = placed;
    place_irqs(irqs, claim_cpus)?;
    let name = format!("{}-{round}", variant.name());
    let pod = PodIdentity::new(&name);
    let tuning = variant.tuning(has_idle_bound());
    let claim = node.allocate_claim_with_parameters(
        &format!("{name}-cpu"),
        "cpudevnuma001",
        2,
        &pod,
        json!({"apiVersion": "v1alpha1", "tuning": tuning}),
    )?;
    let prepared = node.prepare(&claim).await?;
    if &prepared.cpus != claim_cpus {
        bail!(
            "the claim got {}, not the {claim_cpus} its interrupts were placed on",
            prepared.cpus
        );
    }
    let mut spec = ContainerSpec::sleeper("busy").with_cdi_device(&prepared.cdi_device);
    spec.command = vec!["sh".into(), "-c".into(), "while :; do :; done".into()];
    let running = node.start_pod(&pod, &[spec]).await?;
    let id = running.id("busy").to_string();
    node.wait_cpus(&id, &prepared.cpus).await?;
    let pid = node.cri.container_pid(&id).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let trace = trace_ipis
        .then(|| IpiTrace::start(&prepared.cpus))
        .transpose()?;
    let (irqs_before, switches_before) = (interrupts()?, switches(pid)?);
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let (irqs_after, switches_after) = (interrupts()?, switches(pid)?);
    if let Some(trace) = trace {
        let summary = trace.summary()?;
        let total: u64 = summary.iter().map(|(n, _)| n).sum();
        println!(
            "  {name}: {total} IPIs aimed at {} traced; most frequent:",
            prepared.cpus
        );
        for (n, what) in summary.iter().take(8) {
            println!("    {n:>7} {what}");
        }
    }
    let (device_irqs, all_irqs) = irqs_after.since(&irqs_before, &prepared.cpus);
    let sources: Vec<String> = irqs_after
        .by_source
        .keys()
        .filter_map(|source| {
            let one = InterruptCounts {
                by_source: [(source.clone(), irqs_after.by_source[source].clone())].into(),
            };
            let (_, n) = one.since(&irqs_before, &prepared.cpus);
            (n > 0).then(|| format!("{source}={n}"))
        })
        .collect();
    println!("  {name} on {}: {}", prepared.cpus, sources.join(" "));
    node.delete_pod(&running).await?;
    node.unprepare(&claim).await?;
    Ok(Sample {
        variant,
        device_irqs,
        all_irqs,
        switches: switches_after.saturating_sub(switches_before),
    })
}

/// `median (min-max)`.
fn spread(mut values: Vec<u64>) -> String {
    values.sort_unstable();
    let median = values.get(values.len() / 2).copied().unwrap_or(0);
    let min = values.first().copied().unwrap_or(0);
    let max = values.last().copied().unwrap_or(0);
    format!("{median} ({min}-{max})")
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let mut rounds = 3usize;
    let mut seconds = 10u64;
    let mut irq_name = "ttyS0".to_string();
    let mut host_hogs = 0usize;
    let mut trace_ipis = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--rounds" => rounds = args.next().context("--rounds N")?.parse()?,
            "--seconds" => seconds = args.next().context("--seconds S")?.parse()?,
            "--irq-name" => irq_name = args.next().context("--irq-name NAME")?,
            "--host-hogs" => host_hogs = args.next().context("--host-hogs N")?.parse()?,
            "--trace-ipis" => trace_ipis = true,
            other => bail!(
                "unknown argument {other} (--rounds N, --seconds S, --irq-name NAME, --host-hogs N, --trace-ipis)"
            ),
        }
    }
    let mut node = Node::start(NodeOptions {
        low_latency_tuning: true,
        ..Default::default()
    })
    .await
    .context("starting the node")?;
    // The claims come from NUMA node 1's device; the load runs on node 0.
    let node0 = std::fs::read_to_string("/sys/devices/system/node/node0/cpulist")
        .context("NUMA node 0's CPUs")?;
    let _load = Load::start(node0.trim())?;
    let _hogs = Load::hogs(host_hogs)?;
    if host_hogs > 0 {
        println!("{host_hogs} unpinned busy loops in the root cgroup");
    }
    // The packed policy's first two CPUs of NUMA node 1, where each claim goes.
    let node1 = std::fs::read_to_string("/sys/devices/system/node/node1/cpulist")
        .context("NUMA node 1's CPUs")?;
    let claim_cpus: CpuSet = CpuSet::parse_cpulist(node1.trim())?
        .iter()
        .take(2)
        .collect();
    let irqs = irqs_named(&irq_name)?;
    if irqs.is_empty() {
        bail!("no interrupt named {irq_name} in /proc/interrupts");
    }
    println!("interrupts {irqs:?} ({irq_name}) placed on {claim_cpus} before each claim");
    // loadBalancing off where the node offers it (cgroup v2 with isolated
    // partitions).
    let partitions = serde_json::Value::from(node.wait_slices().await?)
        .to_string()
        .contains(r#""dra.cpu/isolatedPartition":{"bool":true}"#);
    let variants: Vec<Variant> = if partitions {
        vec![Variant::Untuned, Variant::Quiet, Variant::Isolated]
    } else {
        println!("no isolated partitions on this node: loadBalancing off is left out");
        vec![Variant::Untuned, Variant::Quiet]
    };
    let mut samples = Vec::new();
    for round in 0..rounds {
        // Rotate which goes first, so drift hits all alike.
        let mut order = variants.clone();
        order.rotate_left(round % variants.len());
        for variant in order {
            let sample = measure(
                &mut node,
                round,
                variant,
                seconds,
                (&irqs, &claim_cpus),
                trace_ipis,
            )
            .await?;
            println!(
                "round {round} {:<8} device interrupts {:>7}  all interrupts {:>7}  involuntary switches {:>7}",
                variant.name(),
                sample.device_irqs,
                sample.all_irqs,
                sample.switches
            );
            samples.push(sample);
        }
    }
    println!(
        "\nmedians (range) over {rounds} rounds of {seconds} s, on a claim's 2 CPUs with a busy loop:"
    );
    println!("| claim | device interrupts | all interrupts (with timer ticks and IPIs) | involuntary switches of the loop |");
    println!("| --- | --- | --- | --- |");
    for variant in variants {
        let pick = |f: fn(&Sample) -> u64| {
            spread(
                samples
                    .iter()
                    .filter(|s| s.variant == variant)
                    .map(f)
                    .collect(),
            )
        };
        println!(
            "| {} | {} | {} | {} |",
            variant.row(has_idle_bound()),
            pick(|s| s.device_irqs),
            pick(|s| s.all_irqs),
            pick(|s| s.switches)
        );
    }
    Ok(())
}
