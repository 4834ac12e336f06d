//! Removing pod cgroups from every hierarchy: kill what runs, then rmdir
//! leaf first.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::mounts::cgroup_mounts;
use super::CgroupError;

/// Directories of `relative` (e.g. `kubepods/pod<uid>`) that exist in any
/// mounted hierarchy (every v1 one and the cgroup2 one).
pub fn existing_dirs(relative: &str) -> Result<Vec<PathBuf>, CgroupError> {
    let relative = relative.trim_start_matches('/');
    Ok(cgroup_mounts()?
        .into_iter()
        .map(|m| m.mount_point.join(relative))
        .filter(|dir| dir.is_dir())
        .collect())
}

/// The file operations removing a cgroup tree needs, so that the order of
/// kills and removals can be checked over a fake tree.
pub trait CgroupTreeFs {
    /// Sub-directories (child cgroups) of `dir`.
    fn child_dirs(&self, dir: &Path) -> std::io::Result<Vec<PathBuf>>;
    fn exists(&self, path: &Path) -> bool;
    fn write(&self, path: &Path, value: &str) -> std::io::Result<()>;
    /// Pids listed in `dir/cgroup.procs` (none when unreadable).
    fn procs(&self, dir: &Path) -> Vec<i32>;
    fn sigkill(&self, pid: i32);
    fn rmdir(&self, dir: &Path) -> std::io::Result<()>;
    /// Waits a little before retrying an rmdir.
    fn pause(&self);
}

/// The real filesystem and signals.
#[derive(Debug, Clone, Copy, Default)]
pub struct RealCgroupFs;

impl CgroupTreeFs for RealCgroupFs {
    fn child_dirs(&self, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
        Ok(std::fs::read_dir(dir)?
            .flatten()
            .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
            .map(|e| e.path())
            .collect())
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn write(&self, path: &Path, value: &str) -> std::io::Result<()> {
        std::fs::write(path, value)
    }

    fn procs(&self, dir: &Path) -> Vec<i32> {
        std::fs::read_to_string(dir.join("cgroup.procs"))
            .map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    fn sigkill(&self, pid: i32) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }

    fn rmdir(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::remove_dir(dir)
    }

    fn pause(&self) {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How many times an rmdir is retried (with [`CgroupTreeFs::pause`] between).
const RMDIR_ATTEMPTS: usize = 500;

/// Kills every process in `dir` and its children and removes them, deepest
/// first. A missing directory is not an error.
pub fn remove_cgroup_tree(dir: &Path) -> Result<(), CgroupError> {
    remove_cgroup_tree_with(&RealCgroupFs, dir)
}

/// [`remove_cgroup_tree`] over any [`CgroupTreeFs`].
///
/// On cgroup v2 with `cgroup.kill` one write at the top kills every process
/// of the subtree, also those forked while the tree is walked. Elsewhere
/// (v1, or v2 before Linux 5.14) every pid in each directory's
/// `cgroup.procs` gets SIGKILL, after a v1 freezer cgroup is thawed (a
/// frozen task would hold through SIGKILL; on v2 fatal signals reach frozen
/// tasks). The pids are killed again at every rmdir retry: a process can
/// take a moment to exit, and an rmdir of a cgroup whose last task is
/// exiting answers EBUSY.
pub fn remove_cgroup_tree_with(fs: &impl CgroupTreeFs, dir: &Path) -> Result<(), CgroupError> {
    remove_tree(fs, dir, false)
}

fn remove_tree(
    fs: &impl CgroupTreeFs,
    dir: &Path,
    subtree_killed: bool,
) -> Result<(), CgroupError> {
    let children = match fs.child_dirs(dir) {
        Ok(children) => children,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(CgroupError::Read {
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    let mut killed = subtree_killed;
    let kill_file = dir.join("cgroup.kill");
    if !killed && fs.exists(&kill_file) {
        // A failed write leaves the per-pid SIGKILL below to do the work.
        killed = fs.write(&kill_file, "1").is_ok();
    }
    for child in children {
        remove_tree(fs, &child, killed)?;
    }
    let freezer_state = dir.join("freezer.state");
    if fs.exists(&freezer_state) {
        let _ = fs.write(&freezer_state, "THAWED");
    }
    let mut last_error = None;
    for _ in 0..RMDIR_ATTEMPTS {
        for pid in fs.procs(dir) {
            fs.sigkill(pid);
        }
        match fs.rmdir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => last_error = Some(e),
        }
        fs.pause();
    }
    let pids = fs.procs(dir);
    if !pids.is_empty() {
        return Err(CgroupError::Busy {
            path: dir.to_path_buf(),
            pids,
        });
    }
    Err(CgroupError::Remove {
        path: dir.to_path_buf(),
        source: last_error.unwrap_or_else(|| std::io::Error::other("rmdir kept failing")),
    })
}

/// Removes `relative` (e.g. `kubepods/pod<uid>`) from every mounted
/// hierarchy, killing what still runs in it.
pub fn remove_everywhere(relative: &str) -> Result<(), CgroupError> {
    for dir in existing_dirs(relative)? {
        remove_cgroup_tree(&dir)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A cgroup tree in memory: which directories exist, which have
    /// `cgroup.kill`, which pids each holds; every operation is logged.
    #[derive(Default)]
    struct FakeTree {
        dirs: std::cell::RefCell<BTreeMap<PathBuf, Vec<i32>>>,
        kill_files: bool,
        log: std::cell::RefCell<Vec<String>>,
    }

    impl FakeTree {
        fn new(kill_files: bool, dirs: &[(&str, &[i32])]) -> FakeTree {
            FakeTree {
                dirs: std::cell::RefCell::new(
                    dirs.iter()
                        .map(|(d, p)| (PathBuf::from(d), p.to_vec()))
                        .collect(),
                ),
                kill_files,
                log: Default::default(),
            }
        }
        fn log(&self, entry: String) {
            self.log.borrow_mut().push(entry);
        }
    }

    impl CgroupTreeFs for FakeTree {
        fn child_dirs(&self, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
            let dirs = self.dirs.borrow();
            if !dirs.contains_key(dir) {
                return Err(std::io::ErrorKind::NotFound.into());
            }
            Ok(dirs
                .keys()
                .filter(|d| d.parent() == Some(dir))
                .cloned()
                .collect())
        }
        fn exists(&self, path: &Path) -> bool {
            let name = path.file_name().and_then(|n| n.to_str());
            let dir = path.parent().map(|p| self.dirs.borrow().contains_key(p));
            dir == Some(true) && name == Some("cgroup.kill") && self.kill_files
        }
        fn write(&self, path: &Path, value: &str) -> std::io::Result<()> {
            self.log(format!("write {} {value}", path.display()));
            if path.ends_with("cgroup.kill") {
                let top = path.parent().unwrap_or(path).to_path_buf();
                for (dir, pids) in self.dirs.borrow_mut().iter_mut() {
                    if dir.starts_with(&top) {
                        pids.clear();
                    }
                }
            }
            Ok(())
        }
        fn procs(&self, dir: &Path) -> Vec<i32> {
            self.dirs.borrow().get(dir).cloned().unwrap_or_default()
        }
        fn sigkill(&self, pid: i32) {
            self.log(format!("kill {pid}"));
            for pids in self.dirs.borrow_mut().values_mut() {
                pids.retain(|p| *p != pid);
            }
        }
        fn rmdir(&self, dir: &Path) -> std::io::Result<()> {
            let busy = {
                let dirs = self.dirs.borrow();
                let populated = dirs.get(dir).map(|p| !p.is_empty()).unwrap_or(false);
                populated || dirs.keys().any(|d| d.parent() == Some(dir))
            };
            if busy {
                self.log(format!("rmdir {} busy", dir.display()));
                return Err(std::io::Error::from_raw_os_error(libc_ebusy()));
            }
            self.log(format!("rmdir {}", dir.display()));
            self.dirs.borrow_mut().remove(dir);
            Ok(())
        }
        fn pause(&self) {}
    }

    fn libc_ebusy() -> i32 {
        nix::errno::Errno::EBUSY as i32
    }

    #[test]
    fn v2_trees_die_by_one_cgroup_kill_then_go_leaf_first() {
        let tree = FakeTree::new(
            true,
            &[
                ("/cg/pod", &[]),
                ("/cg/pod/a", &[10, 11]),
                ("/cg/pod/b", &[12]),
                ("/cg/pod/b/x", &[13]),
            ],
        );
        remove_cgroup_tree_with(&tree, Path::new("/cg/pod")).unwrap();
        assert_eq!(
            *tree.log.borrow(),
            [
                "write /cg/pod/cgroup.kill 1",
                "rmdir /cg/pod/a",
                "rmdir /cg/pod/b/x",
                "rmdir /cg/pod/b",
                "rmdir /cg/pod",
            ]
        );
        assert!(tree.dirs.borrow().is_empty());
    }

    #[test]
    fn without_cgroup_kill_every_pid_gets_sigkill_leaf_first() {
        let tree = FakeTree::new(
            false,
            &[
                ("/cg/pod", &[9]),
                ("/cg/pod/a", &[10, 11]),
                ("/cg/pod/a/x", &[13]),
            ],
        );
        remove_cgroup_tree_with(&tree, Path::new("/cg/pod")).unwrap();
        assert_eq!(
            *tree.log.borrow(),
            [
                "kill 13",
                "rmdir /cg/pod/a/x",
                "kill 10",
                "kill 11",
                "rmdir /cg/pod/a",
                "kill 9",
                "rmdir /cg/pod",
            ]
        );
    }

    #[test]
    fn a_pid_that_never_dies_is_named_in_the_error() {
        struct Immortal(FakeTree);
        impl CgroupTreeFs for Immortal {
            fn child_dirs(&self, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
                self.0.child_dirs(dir)
            }
            fn exists(&self, path: &Path) -> bool {
                self.0.exists(path)
            }
            fn write(&self, path: &Path, value: &str) -> std::io::Result<()> {
                self.0.write(path, value)
            }
            fn procs(&self, dir: &Path) -> Vec<i32> {
                self.0.procs(dir)
            }
            fn sigkill(&self, _pid: i32) {}
            fn rmdir(&self, dir: &Path) -> std::io::Result<()> {
                self.0.rmdir(dir)
            }
            fn pause(&self) {}
        }
        let tree = Immortal(FakeTree::new(false, &[("/cg/pod", &[42])]));
        let err = remove_cgroup_tree_with(&tree, Path::new("/cg/pod")).unwrap_err();
        assert!(
            matches!(&err, CgroupError::Busy { pids, .. } if pids == &[42]),
            "{err}"
        );
    }

    #[test]
    fn missing_cgroup_tree_is_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        remove_cgroup_tree(&dir.path().join("absent")).unwrap();
    }
}
