//! Host cgroups (`--host-cgroups`): keeps the `cpuset.cpus` of cgroup v2
//! cgroups that hold host daemons (`system.slice`: journald, sshd, the
//! runtime and kubelet themselves) equal to the shared pool plus the
//! reserved CPUs, so they leave a claim's CPUs as containers do.
//!
//! The decisions are plain functions in their rooms: which path is
//! acceptable ([`paths`]), which cpuset a host cgroup gets and when it is
//! written ([`cpusets`]), which cgroups a previous run left to restore
//! ([`state_file`]). [`HostCgroups`] here is the thin writer that reads and
//! writes cgroupfs and the small state file.
//!
//! Kernel facts this relies on (Documentation/admin-guide/cgroup-v2.rst):
//! - `cpuset.cpus` exists in a cgroup only when its parent's
//!   `cgroup.subtree_control` lists `cpuset` ("controller interface files
//!   ... are owned by the parent"), and a controller can be enabled there
//!   only when the grandparent has it enabled (top-down constraint), so it
//!   is enabled from the root down.
//! - An empty `cpuset.cpus` means "the nearest ancestor's"; a cgroup's
//!   `cpuset.cpus.effective` is its `cpuset.cpus` ∩ its parent's effective
//!   CPUs, so the children of a listed cgroup (every service of
//!   `system.slice`) follow it without being written.
//! - Only the ancestors of a listed cgroup get `+cpuset`. The root is
//!   exempt from the no-internal-process rule; a lower ancestor that holds
//!   processes of its own may refuse it (EBUSY, unless it could become a
//!   thread root, cpuset being a threaded controller), and the error names
//!   the file. systemd leaves processes only in leaves, so a listed slice's
//!   ancestors normally have none.
//! - Kernels up to at least 6.12 refuse (ENOSPC) to empty the `cpuset.cpus`
//!   of a cgroup that holds processes, v2 included; see
//!   [`use_parent_instead_of_empty`].

use std::io;
use std::path::{Path, PathBuf};

use shared_state::CpuSet;

pub mod cpusets;
pub mod paths;
pub mod state_file;

use cpusets::{drifted, lists_cpuset, needs_write, use_parent_instead_of_empty};
use paths::parse_cgroup_path;
use state_file::{stale_entries, HostCgroupState, STATE_FILE};

use paths::find_pod_cgroup;
use state_file::{load_state, save_state};

/// Why a host cgroup is refused, or its files could not be handled.
#[derive(Debug, thiserror::Error)]
pub enum HostCgroupError {
    #[error("--host-cgroups {path:?}: {reason}")]
    BadPath { path: String, reason: &'static str },
    #[error("--host-cgroups {path}: {} does not exist", dir.display())]
    Missing { path: String, dir: PathBuf },
    #[error("--host-cgroups {path}: {} is not a cgroup v2 cgroup (no cgroup.controllers); host cgroups need the unified hierarchy", dir.display())]
    NotCgroupV2 { path: String, dir: PathBuf },
    #[error("--host-cgroups {path}: it holds pod cgroups ({}); only cgroups of host daemons may be listed, pods are placed by their containers", pods.display())]
    HoldsPods { path: String, pods: PathBuf },
    #[error("--host-cgroups {path}: the cpuset controller is not available in {} (cgroup.controllers: {controllers:?})", dir.display())]
    NoCpuset {
        path: String,
        dir: PathBuf,
        controllers: String,
    },
    #[error("--host-cgroups {path}: {what} {}: {source}", file.display())]
    Io {
        path: String,
        what: &'static str,
        file: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("host cgroups state file {}: {source}", file.display())]
    State {
        file: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// One managed cgroup.
#[derive(Debug)]
struct Managed {
    /// The relative path, as logged and stored.
    path: String,
    dir: PathBuf,
    /// The cpuset last written successfully.
    last: Option<CpuSet>,
}

/// The outcome of one [`HostCgroups::apply`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ApplyOutcome {
    pub written: usize,
    pub failed: usize,
}

/// The cgroupfs side of `--host-cgroups`. See the module docs.
#[derive(Debug)]
pub struct HostCgroups {
    root: PathBuf,
    state_file: PathBuf,
    state: HostCgroupState,
    managed: Vec<Managed>,
}

fn io_error(path: &str, what: &'static str, file: PathBuf, source: io::Error) -> HostCgroupError {
    HostCgroupError::Io {
        path: path.to_string(),
        what,
        file,
        source,
    }
}

/// Writes one value to a cgroup interface file. A value ends in a newline:
/// the kernel strips it, and an empty `cpuset.cpus` ("the parent's") must
/// still be a write of one byte, as a zero-length write may never reach
/// the kernel's handler.
fn write_value(file: &Path, value: &str) -> io::Result<()> {
    std::fs::write(file, format!("{value}\n"))
}

impl HostCgroups {
    /// Validates every path, enables the cpuset controller on the way to
    /// each, gives back cgroups a previous run managed that are no longer
    /// listed, and records the original `cpuset.cpus` of new ones in
    /// `<state_dir>/host-cgroups.json`. Nothing is written to a listed
    /// cgroup's `cpuset.cpus` yet: [`HostCgroups::apply`] does that.
    pub fn open(
        cgroup_root: &Path,
        paths: &[String],
        state_dir: &Path,
    ) -> Result<Self, HostCgroupError> {
        let mut relative = Vec::new();
        for raw in paths {
            let rel = parse_cgroup_path(raw)?;
            if !relative.contains(&rel) {
                relative.push(rel);
            }
        }
        let state_file = state_dir.join(STATE_FILE);
        let state = load_state(&state_file)?;
        let mut me = HostCgroups {
            root: cgroup_root.to_path_buf(),
            state_file,
            state,
            managed: Vec::new(),
        };
        // Before anything new is validated: a removed entry is given back
        // even when a listed one is refused below.
        me.restore_stale(&relative);
        for rel in relative {
            let path = rel.to_string_lossy().into_owned();
            let dir = me.root.join(&rel);
            me.validate(&path, &dir)?;
            me.enable_cpuset_above(&path, &rel)?;
            let file = dir.join("cpuset.cpus");
            let current = std::fs::read_to_string(&file)
                .map_err(|e| io_error(&path, "reading", file.clone(), e))?;
            // The first value seen is the original; a later start (after a
            // crash that left the cgroup shrunk) must not take ours for it.
            me.state
                .originals
                .entry(path.clone())
                .or_insert_with(|| current.trim().to_string());
            me.managed.push(Managed {
                path,
                dir,
                last: None,
            });
        }
        me.save_state()?;
        Ok(me)
    }

    /// The relative paths managed, in order.
    pub fn paths(&self) -> Vec<&str> {
        self.managed.iter().map(|m| m.path.as_str()).collect()
    }

    fn validate(&self, path: &str, dir: &Path) -> Result<(), HostCgroupError> {
        if !self.root.join("cgroup.controllers").is_file() {
            return Err(HostCgroupError::NotCgroupV2 {
                path: path.to_string(),
                dir: self.root.clone(),
            });
        }
        if !dir.is_dir() {
            return Err(HostCgroupError::Missing {
                path: path.to_string(),
                dir: dir.to_path_buf(),
            });
        }
        if !dir.join("cgroup.controllers").is_file() {
            return Err(HostCgroupError::NotCgroupV2 {
                path: path.to_string(),
                dir: dir.to_path_buf(),
            });
        }
        let found =
            find_pod_cgroup(dir, 0).map_err(|e| io_error(path, "walking", dir.to_path_buf(), e))?;
        if let Some(pods) = found {
            return Err(HostCgroupError::HoldsPods {
                path: path.to_string(),
                pods,
            });
        }
        Ok(())
    }

    /// `+cpuset` in `cgroup.subtree_control` of the root and of every
    /// ancestor of `rel` below it, top down, where it is missing.
    fn enable_cpuset_above(&self, path: &str, rel: &Path) -> Result<(), HostCgroupError> {
        let mut parent = self.root.clone();
        let mut components = rel.components().peekable();
        while let Some(component) = components.next() {
            let control = parent.join("cgroup.subtree_control");
            let text = std::fs::read_to_string(&control)
                .map_err(|e| io_error(path, "reading", control.clone(), e))?;
            if !lists_cpuset(&text) {
                let available = parent.join("cgroup.controllers");
                let controllers = std::fs::read_to_string(&available)
                    .map_err(|e| io_error(path, "reading", available.clone(), e))?;
                if !lists_cpuset(&controllers) {
                    return Err(HostCgroupError::NoCpuset {
                        path: path.to_string(),
                        dir: parent,
                        controllers: controllers.trim().to_string(),
                    });
                }
                write_value(&control, "+cpuset")
                    .map_err(|e| io_error(path, "enabling cpuset in", control.clone(), e))?;
                tracing::info!(
                    host_cgroup = path, file = %control.display(),
                    "enabled the cpuset controller (it was off, as systemd leaves it unless a unit sets AllowedCPUs)"
                );
            }
            parent.push(component);
            if components.peek().is_none() {
                break;
            }
        }
        Ok(())
    }

    /// Writes `want` to every managed cgroup whose last successful write
    /// differs. A failure is logged with the path and errno and counted;
    /// the cgroup is tried again at the next call.
    pub fn apply(&mut self, want: &CpuSet) -> ApplyOutcome {
        let mut outcome = ApplyOutcome::default();
        let value = want.to_cpulist();
        for m in &mut self.managed {
            if !needs_write(m.last.as_ref(), want) {
                continue;
            }
            let file = m.dir.join("cpuset.cpus");
            match write_value(&file, &value) {
                Ok(()) => {
                    tracing::info!(host_cgroup = %m.path, cpus = %value, "host cgroup cpuset written");
                    m.last = Some(want.clone());
                    outcome.written += 1;
                }
                Err(e) => {
                    tracing::warn!(
                        host_cgroup = %m.path, file = %file.display(), cpus = %value,
                        errno = e.raw_os_error(), error = %e,
                        "host cgroup cpuset write failed; retried at the next pool change"
                    );
                    outcome.failed += 1;
                }
            }
        }
        outcome
    }

    /// Re-reads every managed cgroup's `cpuset.cpus` and forgets the last
    /// write of those changed by someone else, so the next
    /// [`HostCgroups::apply`] writes them again. Returns how many drifted.
    pub fn check_drift(&mut self) -> usize {
        let mut changed = 0;
        for m in &mut self.managed {
            let file = m.dir.join("cpuset.cpus");
            let Ok(read) = std::fs::read_to_string(&file) else {
                continue;
            };
            if drifted(&read, m.last.as_ref()) {
                tracing::warn!(
                    host_cgroup = %m.path, found = %read.trim(),
                    wrote = %m.last.as_ref().map(CpuSet::to_cpulist).unwrap_or_default(),
                    "host cgroup cpuset changed by someone else (systemd AllowedCPUs=?); writing it again"
                );
                m.last = None;
                changed += 1;
            }
        }
        changed
    }

    /// Gives every managed cgroup its original `cpuset.cpus` back and
    /// forgets it (a cgroup that could not be written stays in the state
    /// file, so the next start tries again). The original, not "every
    /// online CPU": it keeps what the operator or systemd (`AllowedCPUs`)
    /// had set, and the usual empty value means "the parent's CPUs", which
    /// also follows CPU hotplug, as before nri-plugin ran.
    pub fn restore(&mut self) -> ApplyOutcome {
        let mut outcome = ApplyOutcome::default();
        let managed = std::mem::take(&mut self.managed);
        for m in &managed {
            if self.restore_one(&m.path) {
                outcome.written += 1;
            } else {
                outcome.failed += 1;
            }
        }
        if let Err(e) = self.save_state() {
            tracing::warn!(error = %e, "could not update the host cgroups state file");
        }
        outcome
    }

    /// Restores the cgroups the state file names that are not in
    /// `configured`.
    fn restore_stale(&mut self, configured: &[PathBuf]) {
        for (path, _) in stale_entries(&self.state, configured) {
            self.restore_one(&path);
        }
    }

    fn restore_one(&mut self, path: &str) -> bool {
        let Some(original) = self.state.originals.get(path).cloned() else {
            return true;
        };
        if !self.root.join("cgroup.controllers").is_file() {
            // The hierarchy is not where it was (not mounted in this
            // container): keep the entry for a run that can reach it.
            tracing::warn!(
                host_cgroup = path, cgroup_root = %self.root.display(),
                "cannot restore a host cgroup: no cgroup v2 hierarchy at the cgroup root; kept for the next start"
            );
            return false;
        }
        let dir = self.root.join(path);
        if !dir.is_dir() {
            // Gone (the slice was removed): nothing is left to give back.
            tracing::info!(
                host_cgroup = path,
                "host cgroup no longer exists; forgetting it"
            );
            self.state.originals.remove(path);
            return true;
        }
        let file = dir.join("cpuset.cpus");
        let written = write_value(&file, &original)
            .map(|()| original.clone())
            .or_else(|e| {
                if !use_parent_instead_of_empty(&original, &e) {
                    return Err(e);
                }
                let parent = dir.parent().unwrap_or(&self.root);
                let effective = std::fs::read_to_string(parent.join("cpuset.cpus.effective"))?;
                let effective = effective.trim().to_string();
                write_value(&file, &effective)?;
                tracing::info!(
                    host_cgroup = path, cpus = %effective,
                    "the kernel refuses an empty cpuset.cpus while the cgroup has processes; wrote its parent's effective CPUs, the CPUs the empty value gave it"
                );
                Ok(effective)
            });
        match written {
            Ok(original) => {
                tracing::info!(host_cgroup = path, cpus = %original, "host cgroup cpuset restored");
                self.state.originals.remove(path);
                true
            }
            Err(e) => {
                tracing::warn!(
                    host_cgroup = path, file = %file.display(), cpus = %original,
                    errno = e.raw_os_error(), error = %e,
                    "could not restore the host cgroup's cpuset; the next start tries again"
                );
                false
            }
        }
    }

    fn save_state(&self) -> Result<(), HostCgroupError> {
        save_state(&self.state_file, &self.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn set(s: &str) -> CpuSet {
        CpuSet::parse_cpulist(s).expect("cpulist")
    }

    #[test]
    fn a_value_changed_behind_its_back_is_written_again() {
        let fs = FakeCgroupFs::new();
        fs.cgroup("system.slice", "");
        let mut hc =
            HostCgroups::open(&fs.root(), &["system.slice".into()], &fs.state_dir()).expect("open");
        hc.apply(&set("2-7"));
        assert_eq!(hc.check_drift(), 0);
        // systemd re-applies an unset AllowedCPUs= on daemon-reload.
        std::fs::write(fs.root().join("system.slice/cpuset.cpus"), "\n").expect("write");
        assert_eq!(hc.check_drift(), 1);
        assert_eq!(hc.apply(&set("2-7")).written, 1);
        assert_eq!(fs.read("system.slice/cpuset.cpus"), "2-7\n");
    }

    /// A cgroupfs look-alike: directories with the interface files cgroup
    /// v2 has, as plain files.
    struct FakeCgroupFs {
        dir: tempfile::TempDir,
    }

    impl FakeCgroupFs {
        fn new() -> Self {
            let me = FakeCgroupFs {
                dir: tempfile::tempdir().expect("tempdir"),
            };
            me.cgroup("", "");
            me
        }

        fn root(&self) -> PathBuf {
            self.dir.path().join("cgroup")
        }

        fn state_dir(&self) -> PathBuf {
            self.dir.path().join("state")
        }

        /// A cgroup at `rel` with `cpuset.cpus` holding `cpus`.
        fn cgroup(&self, rel: &str, cpus: &str) {
            let dir = self.root().join(rel);
            std::fs::create_dir_all(&dir).expect("mkdir");
            std::fs::write(dir.join("cgroup.controllers"), "cpuset cpu memory pids\n")
                .expect("controllers");
            std::fs::write(dir.join("cgroup.subtree_control"), "").expect("subtree");
            if !rel.is_empty() {
                std::fs::write(dir.join("cpuset.cpus"), format!("{cpus}\n")).expect("cpus");
            }
        }

        fn read(&self, rel: &str) -> String {
            std::fs::read_to_string(self.root().join(rel)).expect("read")
        }
    }

    #[test]
    fn refusals_name_the_path() {
        let fs = FakeCgroupFs::new();
        fs.cgroup("system.slice", "");
        fs.cgroup("all.slice", "");
        fs.cgroup("all.slice/kubepods.slice", "");
        fs.cgroup("deep.slice", "");
        fs.cgroup("deep.slice/a/kubepods", "");
        std::fs::create_dir_all(fs.root().join("v1ish")).expect("mkdir");
        let cases = [
            ("nothing.slice", "does not exist"),
            ("all.slice", "holds pod cgroups"),
            ("deep.slice", "deep.slice/a/kubepods"),
            ("v1ish", "not a cgroup v2 cgroup"),
            ("../etc", "'..'"),
        ];
        for (path, needle) in cases {
            let err = HostCgroups::open(
                &fs.root(),
                &["system.slice".to_string(), path.to_string()],
                &fs.state_dir(),
            )
            .expect_err(path);
            let text = err.to_string();
            assert!(
                text.contains(needle) && text.contains(path.trim_start_matches("../")),
                "{path}: {text}"
            );
        }
        // Without cgroup.controllers at the root it is not cgroup v2.
        std::fs::remove_file(fs.root().join("cgroup.controllers")).expect("rm");
        let err = HostCgroups::open(&fs.root(), &["system.slice".into()], &fs.state_dir())
            .expect_err("v1 root");
        assert!(err.to_string().contains("not a cgroup v2"), "{err}");
    }

    #[test]
    fn cpuset_enabled_top_down_when_missing() {
        let fs = FakeCgroupFs::new();
        fs.cgroup("a.slice", "");
        fs.cgroup("a.slice/b.service", "");
        std::fs::write(fs.root().join("cgroup.subtree_control"), "cpu memory\n").expect("root");
        let hc = HostCgroups::open(&fs.root(), &["a.slice/b.service".into()], &fs.state_dir())
            .expect("open");
        assert_eq!(hc.paths(), vec!["a.slice/b.service"]);
        // The fake file keeps the last write; the kernel would merge it.
        assert_eq!(fs.read("cgroup.subtree_control"), "+cpuset\n");
        assert_eq!(fs.read("a.slice/cgroup.subtree_control"), "+cpuset\n");
        assert_eq!(
            fs.read("a.slice/b.service/cgroup.subtree_control"),
            "",
            "the listed cgroup's own subtree_control is not touched"
        );
        // Already on: not written again.
        std::fs::write(fs.root().join("cgroup.subtree_control"), "cpuset cpu\n").expect("root");
        std::fs::write(fs.root().join("a.slice/cgroup.subtree_control"), "cpuset\n").expect("a");
        HostCgroups::open(&fs.root(), &["a.slice/b.service".into()], &fs.state_dir())
            .expect("open again");
        assert_eq!(fs.read("cgroup.subtree_control"), "cpuset cpu\n");

        // A cgroup whose parent cannot give cpuset is refused by name.
        fs.cgroup("c.slice", "");
        fs.cgroup("c.slice/d", "");
        std::fs::write(fs.root().join("c.slice/cgroup.controllers"), "cpu memory\n").expect("c");
        let err = HostCgroups::open(&fs.root(), &["c.slice/d".into()], &fs.state_dir())
            .expect_err("no cpuset");
        assert!(
            err.to_string()
                .contains("cpuset controller is not available")
                && err.to_string().contains("c.slice/d"),
            "{err}"
        );
    }

    #[test]
    fn apply_writes_changes_only_and_restore_gives_the_original_back() {
        let fs = FakeCgroupFs::new();
        fs.cgroup("system.slice", "");
        fs.cgroup("user.slice", "0-5");
        let mut hc = HostCgroups::open(
            &fs.root(),
            &["system.slice".into(), "/user.slice".into()],
            &fs.state_dir(),
        )
        .expect("open");
        assert_eq!(
            fs.read("system.slice/cpuset.cpus"),
            "\n",
            "open writes none"
        );
        let state: HostCgroupState = serde_json::from_str(
            &std::fs::read_to_string(fs.state_dir().join(STATE_FILE)).expect("state"),
        )
        .expect("json");
        assert_eq!(
            state.originals,
            BTreeMap::from([
                ("system.slice".to_string(), String::new()),
                ("user.slice".to_string(), "0-5".to_string())
            ])
        );

        let out = hc.apply(&set("0,3-7"));
        assert_eq!(
            out,
            ApplyOutcome {
                written: 2,
                failed: 0
            }
        );
        assert_eq!(fs.read("system.slice/cpuset.cpus"), "0,3-7\n");
        assert_eq!(fs.read("user.slice/cpuset.cpus"), "0,3-7\n");
        assert_eq!(
            hc.apply(&set("0,3-7")),
            ApplyOutcome::default(),
            "unchanged"
        );

        // A failed write is counted and retried at the next change.
        std::fs::remove_dir_all(fs.root().join("user.slice")).expect("rm");
        assert_eq!(
            hc.apply(&set("0-7")),
            ApplyOutcome {
                written: 1,
                failed: 1
            }
        );
        fs.cgroup("user.slice", "0,3-7");
        assert_eq!(
            hc.apply(&set("0-7")),
            ApplyOutcome {
                written: 1,
                failed: 0
            },
            "only the one that failed"
        );
        assert_eq!(fs.read("user.slice/cpuset.cpus"), "0-7\n");

        let out = hc.restore();
        assert_eq!(
            out,
            ApplyOutcome {
                written: 2,
                failed: 0
            }
        );
        assert_eq!(fs.read("system.slice/cpuset.cpus"), "\n");
        assert_eq!(fs.read("user.slice/cpuset.cpus"), "0-5\n");
        assert!(
            !fs.state_dir().join(STATE_FILE).exists(),
            "nothing left to remember"
        );
    }

    #[test]
    fn a_restart_keeps_the_first_original_and_restores_removed_entries() {
        let fs = FakeCgroupFs::new();
        fs.cgroup("system.slice", "");
        fs.cgroup("user.slice", "1-2");
        let mut first = HostCgroups::open(
            &fs.root(),
            &["system.slice".into(), "user.slice".into()],
            &fs.state_dir(),
        )
        .expect("open");
        first.apply(&set("4-7"));
        // The process dies without restoring (kill -9).
        drop(first);

        // Started again with the same list: the originals stay those seen
        // before the first write, not the shrunk value.
        let mut second = HostCgroups::open(
            &fs.root(),
            &["system.slice".into(), "user.slice".into()],
            &fs.state_dir(),
        )
        .expect("reopen");
        second.apply(&set("3-7"));
        drop(second);

        // Started with user.slice removed from the list: it is restored at
        // once, system.slice stays managed.
        let mut third = HostCgroups::open(&fs.root(), &["system.slice".into()], &fs.state_dir())
            .expect("without user.slice");
        assert_eq!(fs.read("user.slice/cpuset.cpus"), "1-2\n");
        assert_eq!(fs.read("system.slice/cpuset.cpus"), "3-7\n");
        third.restore();
        assert_eq!(fs.read("system.slice/cpuset.cpus"), "\n");

        // Started with nothing listed after a crash: everything goes back.
        let mut fourth =
            HostCgroups::open(&fs.root(), &["system.slice".into()], &fs.state_dir()).expect("open");
        fourth.apply(&set("5"));
        drop(fourth);
        // A start that cannot see the hierarchy keeps the entry.
        HostCgroups::open(&fs.dir.path().join("elsewhere"), &[], &fs.state_dir())
            .expect("no hierarchy");
        assert_eq!(fs.read("system.slice/cpuset.cpus"), "5\n");
        assert!(fs.state_dir().join(STATE_FILE).exists(), "kept");
        let none = HostCgroups::open(&fs.root(), &[], &fs.state_dir()).expect("no list");
        assert!(none.paths().is_empty());
        assert_eq!(fs.read("system.slice/cpuset.cpus"), "\n");
        assert!(!fs.state_dir().join(STATE_FILE).exists());
    }

    #[test]
    fn a_corrupt_state_file_is_refused_by_name() {
        let fs = FakeCgroupFs::new();
        fs.cgroup("system.slice", "");
        std::fs::create_dir_all(fs.state_dir()).expect("mkdir");
        std::fs::write(fs.state_dir().join(STATE_FILE), "{not json").expect("write");
        let err = HostCgroups::open(&fs.root(), &["system.slice".into()], &fs.state_dir())
            .expect_err("corrupt");
        assert!(err.to_string().contains(STATE_FILE), "{err}");
    }
}
