//! The bench: dra-plugin, its fake API server and kubelet stand-in, and
//! nri-plugin, started, stopped and driven through claims.

use super::{find_binary, free_port, http_get, metric, sysfs_1024, NODE, NUMA_NODES, SETTLE};
use anyhow::{bail, Context};
use dra_cpu_tests::apiserver::FakeApiServer;
use dra_cpu_tests::kubelet_dra::{Claim, DraVersion, KubeletDra};
use dra_cpu_tests::node::claim_objects::{allocated_claim, device_class};
use dra_cpu_tests::node::layout::{dra_plugin_args, nri_plugin_args, NodeLayout, NodeOptions};
use dra_cpu_tests::node::{DRIVER_NAME, NAMESPACE};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

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
    pub(super) cdi: CdiPlacement,
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

    pub(super) fn kubelet(&self) -> anyhow::Result<&KubeletDra> {
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

    /// Row 7's load: `count` new claims of 1 CPU prepared 32 at a time,
    /// and nri-plugin (when running) caught up with them.
    pub async fn prepare_new_claims(&mut self, count: usize) -> anyhow::Result<Vec<Claim>> {
        let claims: Vec<Claim> = (0..count)
            .map(|_| self.new_claim(1))
            .collect::<Result<_, _>>()?;
        self.prepare_all(&claims, 32).await?;
        if self.nri_pid().is_some() {
            let revision = self.dra_revision().context("dra-plugin revision")?;
            self.wait_nri_revision(revision).await?;
        }
        Ok(claims)
    }
}
