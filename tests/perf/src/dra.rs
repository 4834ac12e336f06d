//! Rows measured on a real `dra-plugin run` process (and an nri-plugin
//! subscribed to it) on a 1024-CPU sysfs tree, with the fake API server
//! holding the claims and the kubelet stand-in calling the real gRPC socket:
//! prepare against the durability floor (row 1), concurrent against
//! sequential prepares (row 2), footprint and restart (row 7).

use super::{human, mib, ratio, rss_kib, summarize, Goal, Row, Verdict};
use anyhow::{bail, Context};
use dra_cpu_tests::apiserver::FakeApiServer;
use dra_cpu_tests::kubelet_dra::{Claim, DraVersion, KubeletDra};
use dra_cpu_tests::node::{
    allocated_claim, device_class, dra_plugin_args, nri_plugin_args, NodeLayout, NodeOptions,
    DRIVER_NAME, NAMESPACE,
};
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const NODE: &str = "node-a";
const NUMA_NODES: u32 = 4;
const SETTLE: Duration = Duration::from_secs(60);

/// A binary of the workspace: `$env`, else the release build, else debug.
pub fn find_binary(name: &str, env: &str) -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os(env).filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    let target = target_dir();
    for profile in ["release", "debug"] {
        let path = target.join(profile).join(name);
        if path.is_file() {
            return Ok(path);
        }
    }
    bail!("{name} not found under {}; set ${env}", target.display())
}

fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"),
    }
}

/// Writes a 1024-CPU sysfs tree (2 sockets × 2 NUMA × 4 L3 × 32 cores × 2
/// threads) with the fixture tool of the shared tree.
fn write_sysfs(root: &Path) -> anyhow::Result<()> {
    let tool = match std::env::var_os("DRA_CPU_SYSFS_TOOL") {
        Some(p) => PathBuf::from(p),
        None => {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/tools/sysfs-fixture.py")
        }
    };
    let status = Command::new("python3")
        .arg(&tool)
        .arg(root)
        .args([
            "--sockets",
            "2",
            "--numa-per-socket",
            "2",
            "--l3-per-numa",
            "4",
        ])
        .args(["--cores-per-l3", "32", "--threads", "2"])
        .stdout(Stdio::null())
        .status()
        .with_context(|| format!("running {}", tool.display()))?;
    if !status.success() {
        bail!("{} failed: {status}", tool.display());
    }
    Ok(())
}

/// The 1024-CPU tree, written once under the target directory (writing its
/// ten thousand files takes longer than most rows) and reused after.
pub fn sysfs_1024() -> anyhow::Result<PathBuf> {
    let root = target_dir().join("tmp/perf-sysfs-1024");
    let done = root.join(".complete");
    if done.is_file() {
        return Ok(root);
    }
    let partial = target_dir().join(format!("tmp/perf-sysfs-1024.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&partial);
    write_sysfs(&partial)?;
    std::fs::write(partial.join(".complete"), b"")?;
    let _ = std::fs::remove_dir_all(&root);
    std::fs::rename(&partial, &root)
        .with_context(|| format!("moving {} into place", partial.display()))?;
    Ok(root)
}

fn free_port() -> anyhow::Result<SocketAddr> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("binding a free port")?;
    Ok(l.local_addr()?)
}

/// GET over plain HTTP/1.0; the body on 200.
fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    (head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200")).then(|| body.into())
}

fn metric(text: &str, name: &str) -> Option<f64> {
    dra_cpu_tests::node::metric_value(text, name)
}

/// dra-plugin, its fake API server and kubelet stand-in, on one directory.
pub struct DraBench {
    pub api: FakeApiServer,
    layout: NodeLayout,
    args: Vec<String>,
    nri_args: Vec<String>,
    bin: PathBuf,
    nri_bin: Option<PathBuf>,
    child: Option<Child>,
    nri: Option<Child>,
    pub kubelet: Option<KubeletDra>,
    next_claim: u32,
    /// Where the CDI specs live, said in the rows' labels.
    cdi: CdiPlacement,
    /// A tmpfs mounted for the CDI directory and the device metadata
    /// files, unmounted on drop.
    cdi_mount: Option<PathBuf>,
    dir: tempfile::TempDir,
}

/// Where the benchmark puts the CDI directory and the device metadata
/// files. On a node `--cdi-dir` defaults to `/var/run/cdi` and the chart
/// puts the metadata under `/var/run/dra-cpu/device-metadata`; `/var/run`
/// is a tmpfs, so those writes cost no disk I/O there; the store is on disk
/// under `/var/lib`. This VM has no tmpfs on `/run`, so the benchmark mounts
/// one to lay the node out the same way, and can also measure both on the
/// store's disk (the metadata then in its default place, the plugin data
/// directory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CdiPlacement {
    /// A private tmpfs, as `/var/run` is on a node.
    Tmpfs,
    /// The disk of the store (ext4 here).
    Disk,
}

impl CdiPlacement {
    pub fn label(self) -> &'static str {
        match self {
            CdiPlacement::Tmpfs => "CDI dir on tmpfs as /var/run/cdi on a node",
            CdiPlacement::Disk => "CDI dir on the store's disk",
        }
    }
}

/// Under the tmpfs, as the chart's `/var/run/dra-cpu/device-metadata`.
const METADATA_UNDER_RUN: &str = "dra-cpu/device-metadata";

/// Mount a private tmpfs on `dir` (root only).
fn mount_tmpfs(dir: &Path) -> anyhow::Result<()> {
    use nix::mount::{mount, MsFlags};
    mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("size=64m,mode=0755"),
    )
    .with_context(|| {
        format!(
            "mounting a tmpfs on {} for the CDI directory (needs root, as scripts/perf.sh does)",
            dir.display()
        )
    })
}

fn stop_child(child: &mut Option<Child>) {
    let Some(mut c) = child.take() else { return };
    let pid = nix::unistd::Pid::from_raw(c.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = c.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = c.kill();
    let _ = c.wait();
}

impl Drop for DraBench {
    fn drop(&mut self) {
        stop_child(&mut self.nri);
        stop_child(&mut self.child);
        if let Some(dir) = self.cdi_mount.take() {
            if let Err(e) = nix::mount::umount2(&dir, nix::mount::MntFlags::MNT_DETACH) {
                eprintln!(
                    "cannot unmount the benchmark's tmpfs {}: {e}",
                    dir.display()
                );
            }
        }
    }
}

impl DraBench {
    /// A bench laid out as on a node: the CDI directory on a tmpfs.
    pub fn new() -> anyhow::Result<DraBench> {
        DraBench::with_cdi(CdiPlacement::Tmpfs)
    }

    pub fn with_cdi(cdi: CdiPlacement) -> anyhow::Result<DraBench> {
        let bin = find_binary("dra-plugin", "DRA_PLUGIN_BIN")?;
        let nri_bin = find_binary("nri-plugin", "NRI_PLUGIN_BIN").ok();
        // Under /tmp (same disk as everything else here) for short socket paths.
        let dir = tempfile::Builder::new()
            .prefix("dcpu-perf-")
            .tempdir_in("/tmp")
            .context("temp dir")?;
        let sysfs = sysfs_1024()?;
        let api = FakeApiServer::start()?;
        api.insert_node(NODE)?;
        api.insert_device_class(device_class()?)?;
        // `run/` stands for the node's `/var/run`: a tmpfs, or a plain
        // directory on the store's disk.
        let run_dir = dir.path().join("run");
        std::fs::create_dir_all(&run_dir)
            .with_context(|| format!("creating {}", run_dir.display()))?;
        let cdi_mount = match cdi {
            CdiPlacement::Tmpfs => {
                mount_tmpfs(&run_dir)?;
                Some(run_dir.clone())
            }
            CdiPlacement::Disk => None,
        };
        let layout = NodeLayout {
            dir: dir.path().to_path_buf(),
            nri_socket: dir.path().join("no-runtime/nri.sock"),
            cdi_dir: run_dir.join("cdi"),
            kubeconfig: api.kubeconfig_path().to_path_buf(),
            dra_metrics: free_port()?,
            nri_metrics: free_port()?,
        };
        for d in [
            layout.plugins_registry(),
            layout.state_dir(),
            layout.cdi_dir.clone(),
        ] {
            std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        }
        let options = NodeOptions {
            node_name: NODE.into(),
            ..NodeOptions::default()
        };
        let with_sysfs = |mut args: Vec<String>| {
            if let Some(i) = args.iter().position(|a| a == "--sysfs-root") {
                if let Some(v) = args.get_mut(i + 1) {
                    *v = sysfs.to_string_lossy().into_owned();
                }
            }
            args
        };
        let mut args = with_sysfs(dra_plugin_args(&layout, &options));
        // As the chart deploys it; `DRA_CPU_PERF_METADATA_ON_DISK=1` keeps
        // the metadata in its default place on the store's disk, to compare
        // the two placements in alternated runs of one build.
        let metadata_on_disk =
            std::env::var_os("DRA_CPU_PERF_METADATA_ON_DISK").is_some_and(|v| v == "1");
        if cdi == CdiPlacement::Tmpfs && !metadata_on_disk {
            args.push(format!(
                "--device-metadata-dir={}",
                run_dir.join(METADATA_UNDER_RUN).display()
            ));
        }
        let nri_args = with_sysfs(nri_plugin_args(&layout, &options));
        Ok(DraBench {
            api,
            layout,
            args,
            nri_args,
            bin,
            nri_bin,
            child: None,
            nri: None,
            kubelet: None,
            next_claim: 0,
            cdi,
            cdi_mount,
            dir,
        })
    }

    pub fn state_dir(&self) -> PathBuf {
        self.layout.state_dir()
    }

    pub fn dra_pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn nri_pid(&self) -> Option<u32> {
        self.nri.as_ref().map(Child::id)
    }

    fn log(&self, name: &str) -> anyhow::Result<std::fs::File> {
        let path = self.dir.path().join(name);
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))
    }

    fn check_running(&mut self) -> anyhow::Result<()> {
        if let Some(c) = self.child.as_mut() {
            if let Ok(Some(status)) = c.try_wait() {
                self.child = None;
                let log = std::fs::read_to_string(self.dir.path().join("dra-plugin.log"))
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                bail!("dra-plugin exited ({status}): {tail:?}");
            }
        }
        Ok(())
    }

    /// Starts dra-plugin and returns how long it took until it was
    /// registered, its slices were in the API server and `/readyz` said
    /// ready (each polled every 2 ms from the spawn).
    pub async fn start(&mut self) -> anyhow::Result<Duration> {
        let reg = self
            .layout
            .plugins_registry()
            .join(format!("{DRIVER_NAME}-reg.sock"));
        let _ = std::fs::remove_file(&reg);
        self.kubelet = None;
        let out = self.log("dra-plugin.log")?;
        let err = out.try_clone()?;
        let started = Instant::now();
        self.child = Some(
            Command::new(&self.bin)
                .args(&self.args)
                .env("RUST_LOG", "info")
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err)
                .spawn()
                .with_context(|| format!("starting {}", self.bin.display()))?,
        );
        let (mut registered, mut sliced, mut ready) = (None, None, None);
        loop {
            self.check_running()?;
            if registered.is_none() && reg.exists() {
                let kubelet = KubeletDra::register(
                    &self.layout.plugins_registry(),
                    DRIVER_NAME,
                    DraVersion::V1,
                    SETTLE,
                )
                .await?;
                self.kubelet = Some(kubelet);
                registered = Some(started.elapsed());
            }
            if sliced.is_none() && !self.node_slices().is_empty() {
                sliced = Some(started.elapsed());
            }
            if ready.is_none() && http_get(self.layout.dra_metrics, "/readyz").is_some() {
                ready = Some(started.elapsed());
            }
            if let (Some(a), Some(b), Some(c)) = (registered, sliced, ready) {
                return Ok(a.max(b).max(c));
            }
            if started.elapsed() > SETTLE {
                bail!("dra-plugin not ready after {SETTLE:?}: registered {registered:?}, slices {sliced:?}, readyz {ready:?}");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    fn node_slices(&self) -> Vec<Value> {
        self.api
            .slice_values()
            .into_iter()
            .filter(|s| s.pointer("/spec/nodeName").and_then(Value::as_str) == Some(NODE))
            .collect()
    }

    /// SIGTERM, wait for the exit, and remove the node's slices so the next
    /// start has to publish them again.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        self.kubelet = None;
        stop_child(&mut self.child);
        for slice in self.node_slices() {
            if let Some(name) = slice.pointer("/metadata/name").and_then(Value::as_str) {
                self.api.delete_slice_behind_back(name)?;
            }
        }
        Ok(())
    }

    /// Starts nri-plugin subscribed to dra-plugin (no runtime: its NRI
    /// socket does not exist) and waits until it is subscribed.
    pub async fn start_nri(&mut self) -> anyhow::Result<()> {
        let Some(bin) = self.nri_bin.clone() else {
            bail!("nri-plugin binary not found");
        };
        let out = self.log("nri-plugin.log")?;
        let err = out.try_clone()?;
        self.nri = Some(
            Command::new(&bin)
                .args(&self.nri_args)
                .env("RUST_LOG", "info")
                .env_remove("NRI_PLUGIN_SOCKET")
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err)
                .spawn()
                .with_context(|| format!("starting {}", bin.display()))?,
        );
        let revision = self.dra_revision().unwrap_or(0);
        self.wait_nri_revision(revision).await
    }

    /// Waits until nri-plugin is subscribed and its view holds revision
    /// `at_least` or later.
    pub async fn wait_nri_revision(&mut self, at_least: u64) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            let text = http_get(self.layout.nri_metrics, "/metrics").unwrap_or_default();
            let connected = metric(&text, "nri_plugin_coordination_connected") == Some(1.0);
            let revision = metric(&text, "nri_plugin_view_revision").unwrap_or(0.0);
            if connected && revision >= at_least as f64 {
                return Ok(());
            }
            if started.elapsed() > SETTLE {
                bail!("nri-plugin not subscribed at revision {at_least} after {SETTLE:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// dra-plugin's store revision, from its metrics.
    pub fn dra_revision(&self) -> Option<u64> {
        let text = http_get(self.layout.dra_metrics, "/metrics")?;
        metric(&text, "dra_cpu_store_revision").map(|v| v as u64)
    }

    /// A claim of `cpus` CPUs in NUMA node `claim number % 4`, allocated and
    /// reserved for its own pod, in the API server.
    pub fn new_claim(&mut self, cpus: u32) -> anyhow::Result<Claim> {
        let n = self.next_claim;
        self.next_claim += 1;
        let name = format!("claim-{n}");
        let mut claim = allocated_claim(
            &name,
            NODE,
            cpus,
            &format!("pod-{n}"),
            &format!("{n:08x}-0000-4000-8000-00000000000f"),
        )?;
        let device = format!("cpudevnuma{:03}", n % NUMA_NODES);
        if let Some(result) = claim
            .status
            .as_mut()
            .and_then(|s| s.allocation.as_mut())
            .and_then(|a| a.devices.as_mut())
            .and_then(|d| d.results.as_mut())
            .and_then(|r| r.first_mut())
        {
            result.device = device;
        }
        let stored = self.api.insert_claim(claim)?;
        let uid = stored.metadata.uid.context("claim stored without a uid")?;
        Ok(Claim {
            namespace: NAMESPACE.into(),
            name,
            uid,
        })
    }

    fn kubelet(&self) -> anyhow::Result<&KubeletDra> {
        self.kubelet
            .as_ref()
            .context("dra-plugin is not registered")
    }

    /// NodePrepareResources for one claim; an error unless it was prepared.
    pub async fn prepare(&self, claim: &Claim) -> anyhow::Result<()> {
        let answers = self.kubelet()?.prepare(std::slice::from_ref(claim)).await?;
        match answers.get(&claim.uid) {
            Some(o) if o.error.is_empty() && !o.devices.is_empty() => Ok(()),
            other => bail!("claim {}: {other:?}", claim.uid),
        }
    }

    pub async fn unprepare(&self, claims: &[Claim]) -> anyhow::Result<()> {
        let answers = self.kubelet()?.unprepare(claims).await?;
        for c in claims {
            match answers.get(&c.uid) {
                Some(e) if e.is_empty() => {}
                other => bail!("unprepare {}: {other:?}", c.uid),
            }
        }
        Ok(())
    }

    /// Prepares every claim, `width` calls in flight at a time.
    pub async fn prepare_all(&self, claims: &[Claim], width: usize) -> anyhow::Result<()> {
        for chunk in claims.chunks(width.max(1)) {
            let calls = chunk.iter().map(|c| self.prepare(c));
            for r in futures::future::join_all(calls).await {
                r?;
            }
        }
        Ok(())
    }
}

/// The durability floor: write a small file, fsync it, rename it into place.
fn floor_once(dir: &Path, bytes: &[u8]) -> anyhow::Result<Duration> {
    let tmp = dir.join(".floor.tmp");
    let dst = dir.join("floor.json");
    let started = Instant::now();
    let mut f = std::fs::File::create(&tmp).with_context(|| format!("{}", tmp.display()))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, &dst)?;
    Ok(started.elapsed())
}

/// Row 1: one-claim NodePrepareResources against the floor, interleaved.
/// Row 1b is the same on a bench whose CDI directory is on the store's disk.
pub async fn prepare_floor_row(bench: &mut DraBench, samples: usize) -> anyhow::Result<Row> {
    let floor_dir = bench.state_dir();
    let spec = vec![b'x'; 400];
    let (mut prepares, mut floors) = (Vec::new(), Vec::new());
    for _ in 0..samples {
        floors.push(floor_once(&floor_dir, &spec)?);
        let claim = bench.new_claim(2)?;
        let started = Instant::now();
        bench.prepare(&claim).await?;
        prepares.push(started.elapsed());
        bench.unprepare(std::slice::from_ref(&claim)).await?;
    }
    let (Some(p), Some(f)) = (summarize(&prepares), summarize(&floors)) else {
        bail!("no samples");
    };
    let (id, goal) = match bench.cdi {
        CdiPlacement::Tmpfs => ("1", Goal::RatioAtMost(1.5)),
        CdiPlacement::Disk => ("1b", Goal::None),
    };
    Ok(Row::timed(
        id,
        &format!(
            "NodePrepareResources, 1 claim, real gRPC socket (store commit + CDI write; {})",
            bench.cdi.label()
        ),
        goal,
        &p,
        Some(("write+fsync+rename 400 B, store's dir", &f)),
        p.median,
        true,
    ))
}

/// Rows 1c and 1d: the parts of row 1 that are not the store commit. 1c is
/// NodePrepareResources of a claim already prepared (the same gRPC call and
/// store lookup, with no API read and no commit); 1d is the GET of the
/// ResourceClaim that a first prepare makes, timed from this process with the
/// same kube client against the same fake API server.
pub async fn prepare_parts_rows(bench: &mut DraBench, samples: usize) -> anyhow::Result<Vec<Row>> {
    let client = bench.api.client().await?;
    let (mut repeats, mut reads) = (Vec::new(), Vec::new());
    for _ in 0..samples {
        let claim = bench.new_claim(2)?;
        bench.prepare(&claim).await?;
        let started = Instant::now();
        bench.prepare(&claim).await?;
        repeats.push(started.elapsed());
        let api: kube::Api<k8s_openapi::api::resource::v1::ResourceClaim> =
            kube::Api::namespaced(client.clone(), &claim.namespace);
        let started = Instant::now();
        api.get(&claim.name).await?;
        reads.push(started.elapsed());
        bench.unprepare(std::slice::from_ref(&claim)).await?;
    }
    let (Some(r), Some(g)) = (summarize(&repeats), summarize(&reads)) else {
        bail!("no samples");
    };
    Ok(vec![
        Row::timed(
            "1c",
            "part of row 1: NodePrepareResources of a prepared claim (gRPC + store lookup; no API read, no commit)",
            Goal::None,
            &r,
            None,
            r.median,
            true,
        ),
        Row::timed(
            "1d",
            "part of row 1: GET of the ResourceClaim (kube client, fake API server on loopback)",
            Goal::None,
            &g,
            None,
            g.median,
            true,
        ),
    ])
}

/// Row 2: 32 prepares of different claims at once against 32 one after
/// another; the ratio is sequential time / concurrent time (throughput).
pub async fn concurrency_row(bench: &mut DraBench, rounds: usize) -> anyhow::Result<Row> {
    const N: usize = 32;
    let (mut seq, mut conc) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let claims: Vec<Claim> = (0..N)
            .map(|_| bench.new_claim(2))
            .collect::<Result<_, _>>()?;
        let started = Instant::now();
        bench.prepare_all(&claims, 1).await?;
        seq.push(started.elapsed());
        bench.unprepare(&claims).await?;

        let claims: Vec<Claim> = (0..N)
            .map(|_| bench.new_claim(2))
            .collect::<Result<_, _>>()?;
        let started = Instant::now();
        bench.prepare_all(&claims, N).await?;
        conc.push(started.elapsed());
        bench.unprepare(&claims).await?;
    }
    let (Some(s), Some(c)) = (summarize(&seq), summarize(&conc)) else {
        bail!("no samples");
    };
    let throughput = ratio(s.median, c.median);
    Ok(Row {
        id: "2".into(),
        what: format!(
            "32 concurrent prepares (different claims) vs 32 sequential: throughput ratio ({})",
            bench.cdi.label()
        ),
        goal: Goal::RatioAtLeast(5.0),
        measured: format!(
            "32 concurrent: median {} (n={})",
            human(c.median),
            c.samples
        ),
        baseline: format!(
            "32 sequential: median {} (n={})",
            human(s.median),
            s.samples
        ),
        ratio: throughput,
        verdict: super::judge(Goal::RatioAtLeast(5.0), c.median, throughput),
    })
}

/// Row 7: RSS of both processes idle and with 1000 claims; dra-plugin
/// start-to-ready with an empty store (baseline) and with 1000 claims.
pub async fn footprint_rows(bench: &mut DraBench, restarts: usize) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    // Settle before reading RSS: the first slices and watches are set up.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let dra_idle = bench
        .dra_pid()
        .and_then(rss_kib)
        .context("dra-plugin RSS")?;
    let nri_idle = bench.nri_pid().and_then(rss_kib);

    let mut empty = Vec::new();
    for _ in 0..restarts {
        bench.stop()?;
        empty.push(bench.start().await?);
    }

    let claims: Vec<Claim> = (0..1000)
        .map(|_| bench.new_claim(1))
        .collect::<Result<_, _>>()?;
    bench.prepare_all(&claims, 32).await?;
    if bench.nri_pid().is_some() {
        let revision = bench.dra_revision().context("dra-plugin revision")?;
        bench.wait_nri_revision(revision).await?;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let dra_full = bench
        .dra_pid()
        .and_then(rss_kib)
        .context("dra-plugin RSS")?;
    let nri_full = bench.nri_pid().and_then(rss_kib);

    let mut full = Vec::new();
    for _ in 0..restarts {
        bench.stop()?;
        full.push(bench.start().await?);
    }
    // Everything was restored from the store: the 1000 claims are prepared.
    let answers = bench.kubelet()?.prepare(&claims[..1]).await?;
    let restored = answers
        .get(&claims[0].uid)
        .is_some_and(|o| o.error.is_empty());

    let record = |id: &str, what: &str, measured: String, baseline: String, r: Option<f64>| Row {
        id: id.into(),
        what: what.into(),
        goal: Goal::None,
        measured,
        baseline,
        ratio: r,
        verdict: Verdict::Info,
    };
    rows.push(record(
        "7a",
        "dra-plugin RSS (VmRSS), 1000 claims prepared",
        mib(dra_full),
        format!("idle, no claims: {}", mib(dra_idle)),
        Some(dra_full as f64 / dra_idle.max(1) as f64),
    ));
    match (nri_idle, nri_full) {
        (Some(idle), Some(f)) => rows.push(record(
            "7b",
            "nri-plugin RSS (VmRSS), view with 1000 claims",
            mib(f),
            format!("idle, no claims: {}", mib(idle)),
            Some(f as f64 / idle.max(1) as f64),
        )),
        _ => rows.push(Row::not_measured(
            "7b",
            "nri-plugin RSS",
            Goal::None,
            "nri-plugin was not running",
        )),
    }
    match (summarize(&full), summarize(&empty)) {
        (Some(f), Some(e)) if restored => {
            let mut row = Row::timed(
                "7d",
                "dra-plugin start to ready (registered + slices published + /readyz), 1000 claims in the store",
                Goal::None,
                &f,
                Some(("empty store", &e)),
                f.median,
                false,
            );
            row.verdict = Verdict::Info;
            rows.push(row);
        }
        _ => rows.push(Row::not_measured(
            "7d",
            "dra-plugin start to ready",
            Goal::None,
            format!("restored from the store: {restored}"),
        )),
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_writes_the_file_in_place() {
        let dir = tempfile::tempdir().expect("dir");
        let took = floor_once(dir.path(), b"{}").expect("floor");
        assert!(took > Duration::ZERO);
        assert_eq!(
            std::fs::read(dir.path().join("floor.json")).expect("file"),
            b"{}"
        );
        assert!(!dir.path().join(".floor.tmp").exists());
    }

    #[test]
    fn the_bench_sysfs_tree_has_1024_cpus() {
        // The fixture tool lives outside the repository; without it the
        // table reports the rows as not measured.
        let Ok(root) = sysfs_1024() else { return };
        // Counting entries, not discovering the topology: discovery reads
        // some ten thousand files, which belongs in the table's run.
        let count = |dir: &str, prefix: &str| {
            std::fs::read_dir(root.join(dir))
                .expect("sysfs dir")
                .filter_map(Result::ok)
                .filter(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.strip_prefix(prefix)
                        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                })
                .count()
        };
        assert_eq!(count("sys/devices/system/cpu", "cpu"), 1024);
        assert_eq!(
            count("sys/devices/system/node", "node"),
            NUMA_NODES as usize
        );
    }
}
