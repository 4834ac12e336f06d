//! The node side of claim tuning: device interrupts kept off tuned CPUs,
//! their idle-state bound and their cpufreq governor, set while their claim
//! is prepared and put back when it is not.
//!
//! Every pass brings the kernel in line with the tuned claims: it first
//! records, durably, the value of everything it is about to change (the
//! record in the state directory), then writes, then forgets the record of
//! what is back to its value. So a crash or a kill at any point leaves the
//! original either in the kernel or in the record, and the pass at the next
//! start (over the stored claims) finishes the job. The record names the
//! boot it was made in: after a reboot the kernel holds its boot values
//! again, and the record is dropped instead of written back to interrupts
//! that may now be other devices'.
//!
//! The pure part (what the values should be) is `shared_state::tuning`.

pub mod irqbalance;
pub mod kernel;
pub mod owner;

use kernel::KernelPaths;
use kernel::{read_value, write_value};
use serde::{Deserialize, Serialize};
use shared_state::tuning::plan::{irq_affinity, wanted, IrqBalanceBaseline, Wanted};
use shared_state::tuning::plan::{Baseline, TunedClaim};
use shared_state::tuning::support::NodeSupport;
use shared_state::CpuSet;
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// This boot's id, under a `/proc`.
const BOOT_ID: &str = "sys/kernel/random/boot_id";

/// Why a tuning pass or the record failed.
#[derive(Debug, thiserror::Error)]
pub enum TuningError {
    #[error("tuning record {path}: {source}")]
    Record {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("tuning record {path} cannot be read ({source}); it holds this node's values from before tuning, so it is kept: restore them by hand from it, or remove it if the node has rebooted since")]
    CorruptRecord {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: {source}")]
    Kernel {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The record on disk: the values before tuning, and the boot they belong to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Record {
    boot_id: String,
    baseline: Baseline,
}

/// What one pass did, for logs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pass {
    /// Values set for tuned claims.
    pub tuned: usize,
    /// Values put back.
    pub restored: usize,
    /// Interrupts whose affinity the kernel does not let anyone set
    /// (managed or per-CPU interrupts).
    pub unmovable_irqs: Vec<u32>,
    /// A running irqbalance that could not be told (or put back): the
    /// interrupts are kept off the CPUs by the repair pass meanwhile.
    pub irqbalance_error: Option<String>,
}

pub struct NodeTuner {
    paths: KernelPaths,
    record_path: PathBuf,
    boot_id: String,
    online: CpuSet,
    support: NodeSupport,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    baseline: Baseline,
    claims: BTreeMap<String, TunedClaim>,
    /// What irqbalance was last told to ban, by daemon: it shows a setting
    /// only from its next rescan, so it is not told the same twice.
    irqbalance_told: Option<(String, CpuSet)>,
    /// The last irqbalance's own banned CPUs as recorded: after it is put
    /// back, it shows our setting until its next rescan, so a claim tuned
    /// again soon after must not take that for its own.
    irqbalance_own: Option<IrqBalanceBaseline>,
}

impl NodeTuner {
    /// Reads the record (dropping one of an earlier boot) and finds what
    /// the node supports for claims on `allocatable`. With `enabled` false
    /// the node supports nothing, but values an earlier run changed are
    /// still put back by [`NodeTuner::reconcile`].
    pub fn open(
        paths: KernelPaths,
        record_path: PathBuf,
        online: CpuSet,
        allocatable: &CpuSet,
        enabled: bool,
    ) -> Result<NodeTuner, TuningError> {
        // The host's /proc may be mounted for irq/ alone; every /proc of a
        // kernel shows its boot id.
        let boot_id = read_value(&paths.procfs.join(BOOT_ID))
            .or_else(|_| read_value(&Path::new("/proc").join(BOOT_ID)))
            .unwrap_or_default();
        let mut baseline = Baseline::default();
        if let Some(record) = read_record(&record_path)? {
            if record.boot_id == boot_id && !boot_id.is_empty() {
                baseline = record.baseline;
            } else {
                tracing::info!(record = %record_path.display(), "the tuning record is of an earlier boot; the kernel holds its boot values again");
                remove_record(&record_path)?;
            }
        }
        let support = if enabled {
            paths.support(allocatable)
        } else {
            NodeSupport::none("low-latency tuning is off on this node (dra-plugin --low-latency-tuning; the chart's draPlugin.lowLatencyTuning)")
        };
        Ok(NodeTuner {
            paths,
            record_path,
            boot_id,
            online,
            support,
            inner: Mutex::new(Inner {
                baseline,
                ..Inner::default()
            }),
        })
    }

    /// What this node can honour.
    pub fn support(&self) -> &NodeSupport {
        &self.support
    }

    /// Tune for exactly `claims` (the stored ones, at start-up).
    pub fn reconcile(&self, claims: Vec<TunedClaim>) -> Result<Pass, TuningError> {
        let mut inner = shared_state::sync::lock(&self.inner);
        inner.claims = claims
            .into_iter()
            .filter(|c| c.tuning.touches_node())
            .map(|c| (c.claim_uid.clone(), c))
            .collect();
        self.pass(&mut inner)
    }

    /// Tune for one more claim. On failure the claim is left out again and
    /// what was set for it is put back.
    pub fn add(&self, claim: TunedClaim) -> Result<Pass, TuningError> {
        if !claim.tuning.touches_node() {
            return Ok(Pass::default());
        }
        let mut inner = shared_state::sync::lock(&self.inner);
        let uid = claim.claim_uid.clone();
        inner.claims.insert(uid.clone(), claim);
        let result = self.pass(&mut inner);
        if result.is_err() {
            inner.claims.remove(&uid);
            if let Err(e) = self.pass(&mut inner) {
                tracing::error!(claim_uid = %uid, error = %e, "cannot put back what a failed tuning set; the repair pass retries");
            }
        }
        result
    }

    /// Stop tuning for a claim and put its CPUs' values back.
    pub fn remove(&self, claim_uid: &str) -> Result<Pass, TuningError> {
        let mut inner = shared_state::sync::lock(&self.inner);
        if inner.claims.remove(claim_uid).is_none() && inner.baseline.is_empty() {
            return Ok(Pass::default());
        }
        self.pass(&mut inner)
    }

    /// The same pass again: sets back what something else rewrote (an
    /// irqbalance moving interrupts onto tuned CPUs) and tunes interrupts
    /// that appeared since.
    pub fn repair(&self) -> Result<Pass, TuningError> {
        let mut inner = shared_state::sync::lock(&self.inner);
        if inner.claims.is_empty() && inner.baseline.is_empty() {
            return Ok(Pass::default());
        }
        self.pass(&mut inner)
    }

    fn pass(&self, inner: &mut Inner) -> Result<Pass, TuningError> {
        let claims: Vec<TunedClaim> = inner.claims.values().cloned().collect();
        let wanted = wanted(&claims);
        // irqbalance is asked only while interrupts are isolated, or to be
        // put back.
        let irqbalance = if wanted.irq_isolated.is_empty() && inner.baseline.irqbalance.is_none() {
            None
        } else {
            irqbalance::find(&self.paths.irqbalance_dir)
        };
        let mut pass = Pass::default();
        let recorded = self.record_originals(
            &inner.baseline,
            &wanted,
            irqbalance.as_ref(),
            inner.irqbalance_own.as_ref(),
            &mut pass,
        )?;
        if recorded.irqbalance.is_some() {
            inner.irqbalance_own.clone_from(&recorded.irqbalance);
        }
        if recorded != inner.baseline {
            self.save(&recorded)?;
            inner.baseline = recorded;
        }
        let mut back = inner.baseline.clone();
        self.set_irqs(&mut back, &wanted.irq_isolated, &mut pass)?;
        set_irqbalance(
            &mut back,
            &wanted.irq_isolated,
            irqbalance.as_ref(),
            &mut inner.irqbalance_told,
            &mut pass,
        );
        set_per_cpu(
            &mut back.idle_latency,
            &wanted.idle_latency,
            |cpu| self.paths.idle_latency(cpu),
            &mut pass,
        )?;
        set_per_cpu(
            &mut back.governor,
            &wanted.governor,
            |cpu| self.paths.governor(cpu),
            &mut pass,
        )?;
        if back != inner.baseline {
            self.save(&back)?;
            inner.baseline = back;
        }
        if let Some(error) = &pass.irqbalance_error {
            tracing::warn!(%error, dir = %self.paths.irqbalance_dir.display(), "irqbalance could not be told which CPUs to keep interrupts off; the repair pass keeps them off and tells it again");
        }
        Ok(pass)
    }

    /// The baseline with the present value of everything `wanted` is about
    /// to change and that is not recorded yet.
    fn record_originals(
        &self,
        baseline: &Baseline,
        wanted: &Wanted,
        irqbalance: Option<&irqbalance::Daemon>,
        remembered: Option<&IrqBalanceBaseline>,
        pass: &mut Pass,
    ) -> Result<Baseline, TuningError> {
        let mut recorded = baseline.clone();
        if !wanted.irq_isolated.is_empty() {
            // The daemon's own banned CPUs, read before it is told anything;
            // a daemon other than the recorded one has restarted since and
            // holds its own configuration again.
            if let Some(daemon) = irqbalance {
                let name = daemon.name();
                if recorded.irqbalance.as_ref().map(|r| &r.daemon) != Some(&name) {
                    match remembered.filter(|r| r.daemon == name) {
                        Some(own) => recorded.irqbalance = Some(own.clone()),
                        None => match daemon.banned() {
                            Ok(banned) => {
                                recorded.irqbalance = Some(IrqBalanceBaseline {
                                    daemon: name,
                                    banned: banned.to_cpulist(),
                                })
                            }
                            Err(e) => pass.irqbalance_error = Some(e.to_string()),
                        },
                    }
                }
            }
            let irqs = self.paths.irqs().map_err(|source| TuningError::Kernel {
                path: self.paths.procfs.join("irq"),
                source,
            })?;
            for irq in irqs {
                if recorded.irq_affinity.contains_key(&irq) {
                    continue;
                }
                // An interrupt without an affinity file (or gone since the
                // listing) is not one anybody can move.
                if let Ok(value) = read_value(&self.paths.irq_affinity(irq)) {
                    recorded.irq_affinity.insert(irq, value);
                }
            }
            if recorded.default_irq_affinity.is_none() {
                recorded.default_irq_affinity =
                    Some(read_kernel(&self.paths.default_irq_affinity())?);
            }
        }
        for cpu in wanted.idle_latency.keys() {
            if !recorded.idle_latency.contains_key(cpu) {
                recorded
                    .idle_latency
                    .insert(*cpu, read_kernel(&self.paths.idle_latency(*cpu))?);
            }
        }
        for cpu in wanted.governor.keys() {
            if !recorded.governor.contains_key(cpu) {
                recorded
                    .governor
                    .insert(*cpu, read_kernel(&self.paths.governor(*cpu))?);
            }
        }
        Ok(recorded)
    }

    /// Sets every recorded interrupt to its original affinity without the
    /// isolated CPUs, or back to its original when none are isolated (and
    /// then forgets it).
    fn set_irqs(
        &self,
        back: &mut Baseline,
        isolated: &CpuSet,
        pass: &mut Pass,
    ) -> Result<(), TuningError> {
        let restoring = isolated.is_empty();
        let mut forget = Vec::new();
        for (irq, original) in &back.irq_affinity {
            let path = self.paths.irq_affinity(*irq);
            let Ok(original_cpus) = CpuSet::parse_cpulist(original) else {
                forget.push(*irq);
                continue;
            };
            let target = irq_affinity(&original_cpus, isolated, &self.online);
            let current = match read_value(&path) {
                Ok(text) => CpuSet::parse_cpulist(&text).ok(),
                // The interrupt is gone (its device was removed).
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    forget.push(*irq);
                    continue;
                }
                Err(source) => return Err(TuningError::Kernel { path, source }),
            };
            if current.as_ref() != Some(&target) {
                // Put back as it was written before, not as we would spell it.
                let text = if restoring {
                    original.clone()
                } else {
                    target.to_cpulist()
                };
                match write_value(&path, &text) {
                    Ok(()) if restoring => pass.restored += 1,
                    Ok(()) => pass.tuned += 1,
                    Err(e) if unmovable(&e) => pass.unmovable_irqs.push(*irq),
                    Err(source) => return Err(TuningError::Kernel { path, source }),
                }
            }
            if restoring {
                forget.push(*irq);
            }
        }
        for irq in forget {
            back.irq_affinity.remove(&irq);
        }
        if let Some(original) = back.default_irq_affinity.clone() {
            let path = self.paths.default_irq_affinity();
            let original_cpus =
                CpuSet::parse_hex_mask(&original).unwrap_or_else(|_| self.online.clone());
            let target = irq_affinity(&original_cpus, isolated, &self.online);
            let current = CpuSet::parse_hex_mask(&read_kernel(&path)?).ok();
            if current.as_ref() != Some(&target) {
                let text = if restoring {
                    original.clone()
                } else {
                    target.to_hex_mask()
                };
                write_value(&path, &text).map_err(|source| TuningError::Kernel { path, source })?;
                if restoring {
                    pass.restored += 1;
                } else {
                    pass.tuned += 1;
                }
            }
            if restoring {
                back.default_irq_affinity = None;
            }
        }
        Ok(())
    }

    fn save(&self, baseline: &Baseline) -> Result<(), TuningError> {
        if baseline.is_empty() {
            return remove_record(&self.record_path);
        }
        let record = Record {
            boot_id: self.boot_id.clone(),
            baseline: baseline.clone(),
        };
        let text = serde_json::to_vec_pretty(&record).map_err(|e| TuningError::Record {
            path: self.record_path.clone(),
            source: io::Error::other(e),
        })?;
        write_durably(&self.record_path, &text).map_err(|source| TuningError::Record {
            path: self.record_path.clone(),
            source,
        })
    }
}

/// Tells a running irqbalance to ban its own CPUs and the isolated ones,
/// or, with none isolated, hands the choice back to its configuration (and
/// forgets the record). Talking to it never fails the pass: the interrupts
/// themselves are already off the CPUs, and the repair pass keeps them off
/// and tells irqbalance again.
fn set_irqbalance(
    back: &mut Baseline,
    isolated: &CpuSet,
    daemon: Option<&irqbalance::Daemon>,
    told: &mut Option<(String, CpuSet)>,
    pass: &mut Pass,
) {
    let Some(recorded) = back.irqbalance.clone() else {
        return;
    };
    let same_daemon = daemon.filter(|d| d.name() == recorded.daemon);
    if isolated.is_empty() {
        if let Some(daemon) = same_daemon {
            if let Err(e) = daemon.set_banned(None) {
                // Kept: the next pass puts it back.
                pass.irqbalance_error = Some(e.to_string());
                return;
            }
            pass.restored += 1;
        }
        // A daemon that has gone or restarted holds none of our setting.
        back.irqbalance = None;
        *told = None;
        return;
    }
    let Some(daemon) = same_daemon else {
        return;
    };
    let own = CpuSet::parse_cpulist(&recorded.banned).unwrap_or_default();
    let ban = own.union(isolated);
    if told.as_ref() == Some(&(recorded.daemon.clone(), ban.clone())) {
        return;
    }
    match daemon.banned() {
        Ok(now) if now == ban => {}
        Ok(_) => match daemon.set_banned(Some(&ban)) {
            Ok(()) => pass.tuned += 1,
            Err(e) => {
                pass.irqbalance_error = Some(e.to_string());
                return;
            }
        },
        Err(e) => {
            pass.irqbalance_error = Some(e.to_string());
            return;
        }
    }
    *told = Some((recorded.daemon, ban));
}

/// Sets each recorded CPU's value to what a claim wants, or back to the
/// original when none does (and then forgets it).
fn set_per_cpu(
    recorded: &mut BTreeMap<u32, String>,
    wanted: &BTreeMap<u32, String>,
    path_of: impl Fn(u32) -> PathBuf,
    pass: &mut Pass,
) -> Result<(), TuningError> {
    let mut forget = Vec::new();
    for (cpu, original) in recorded.iter() {
        let path = path_of(*cpu);
        let target = wanted.get(cpu);
        let current = read_kernel(&path)?;
        let value = target.unwrap_or(original);
        if current != *value {
            write_value(&path, value).map_err(|source| TuningError::Kernel { path, source })?;
            if target.is_some() {
                pass.tuned += 1;
            } else {
                pass.restored += 1;
            }
        }
        if target.is_none() {
            forget.push(*cpu);
        }
    }
    for cpu in forget {
        recorded.remove(&cpu);
    }
    Ok(())
}

/// The kernel refuses to move this interrupt: a managed one, whose file
/// it makes read-only (EACCES without CAP_DAC_OVERRIDE, EPERM with it), a
/// per-CPU one (EIO), the timer (EPERM), a mask its chip cannot take
/// (EINVAL), or no vector left on the target CPUs (ENOSPC, EBUSY). The
/// node's support check found `/proc/irq` writable as a whole, so these
/// are this interrupt's; a read-only mount (EROFS) fails the pass.
fn unmovable(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EACCES | libc::EIO | libc::EPERM | libc::EINVAL | libc::ENOSPC | libc::EBUSY)
    )
}

fn read_kernel(path: &Path) -> Result<String, TuningError> {
    read_value(path).map_err(|source| TuningError::Kernel {
        path: path.to_path_buf(),
        source,
    })
}

fn read_record(path: &Path) -> Result<Option<Record>, TuningError> {
    match std::fs::read(path) {
        Ok(bytes) => {
            serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| TuningError::CorruptRecord {
                    path: path.to_path_buf(),
                    source,
                })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TuningError::Record {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn remove_record(path: &Path) -> Result<(), TuningError> {
    match std::fs::remove_file(path) {
        Ok(()) => sync_parent(path).map_err(|source| TuningError::Record {
            path: path.to_path_buf(),
            source,
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(TuningError::Record {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Write to a temporary file, fsync it, rename it over `path`, fsync the
/// directory: the record is the old one or the new one after a power cut.
fn write_durably(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)?;
    sync_parent(path)
}

fn sync_parent(path: &Path) -> io::Result<()> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => std::fs::File::open(dir)?.sync_all(),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests;
