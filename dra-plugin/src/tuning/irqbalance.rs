//! irqbalance, told through its socket which CPUs to keep interrupts off.
//!
//! irqbalance moves interrupts on its own every few seconds: untold, it
//! puts them back on tuned CPUs between two repair passes. A daemon built
//! with its UI (Debian's, Fedora's, Ubuntu's) listens on
//! `/run/irqbalance/irqbalance<pid>.sock` for root peers (it checks the
//! credentials the kernel passes): `setup` answers
//! `SLEEP <s> [IRQ <n> LOAD .. DIFF .. CLASS ..]... BANNED <hex mask>`, and
//! `settings cpus <list>` replaces the CPUs it bans (those of its
//! `IRQBALANCE_BANNED_CPULIST`, or the isolcpus and nohz_full CPUs it finds
//! itself) until `settings cpus NULL` hands them back to its own
//! configuration. A setting takes effect at its next rescan, and `setup`
//! shows it from then on.

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, UnixCredentials};
use shared_state::{CpuSet, CpuSetError};
use std::io::{self, IoSlice, Read};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// How long one request may take: irqbalance answers from its main loop,
/// between two balancing passes.
const TIMEOUT: Duration = Duration::from_secs(2);

/// One running irqbalance, by its socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Daemon {
    socket: PathBuf,
}

impl Daemon {
    pub fn at(socket: PathBuf) -> Daemon {
        Daemon { socket }
    }

    /// The socket's file name (`irqbalance<pid>.sock`): a restarted daemon
    /// has a new one, and none of its predecessor's settings.
    pub fn name(&self) -> String {
        self.socket
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// The CPUs it keeps interrupts off now.
    pub fn banned(&self) -> io::Result<CpuSet> {
        let answer = self.request("setup")?;
        banned_of_setup(&answer).map_err(|why| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {why}", self.socket.display()),
            )
        })
    }

    /// Ban exactly `cpus`, or, with `None`, hand the choice back to its
    /// own configuration.
    pub fn set_banned(&self, cpus: Option<&CpuSet>) -> io::Result<()> {
        let list = match cpus {
            Some(cpus) if !cpus.is_empty() => cpus.to_cpulist(),
            _ => "NULL".to_string(),
        };
        self.request(&format!("settings cpus {list}")).map(drop)
    }

    /// Sends one request and reads until irqbalance closes the connection,
    /// which it does once the request is handled (after the answer, if the
    /// request has one).
    fn request(&self, command: &str) -> io::Result<String> {
        let stream = UnixStream::connect(&self.socket)?;
        stream.set_read_timeout(Some(TIMEOUT))?;
        stream.set_write_timeout(Some(TIMEOUT))?;
        // irqbalance reads the sender's credentials from the message and
        // ignores a request without them.
        let credentials = UnixCredentials::new();
        sendmsg::<()>(
            stream.as_raw_fd(),
            &[IoSlice::new(command.as_bytes())],
            &[ControlMessage::ScmCredentials(&credentials)],
            MsgFlags::empty(),
            None,
        )
        .map_err(io::Error::from)?;
        let mut answer = String::new();
        stream.take(64 * 1024).read_to_string(&mut answer)?;
        Ok(answer)
    }
}

/// The newest irqbalance in `dir` that answers, if any: sockets of
/// daemons that died without removing them refuse the connection.
pub fn find(dir: &Path) -> Option<Daemon> {
    let entries = std::fs::read_dir(dir).ok()?;
    let mut sockets: Vec<(SystemTime, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter(|entry| is_socket_name(&entry.file_name().to_string_lossy()))
        .map(|entry| {
            let modified = entry
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            (modified, entry.path())
        })
        .collect();
    sockets.sort_by(|a, b| b.cmp(a));
    sockets
        .into_iter()
        .map(|(_, socket)| Daemon::at(socket))
        .find(|daemon| daemon.banned().is_ok())
}

/// `irqbalance<pid>.sock`.
fn is_socket_name(name: &str) -> bool {
    name.strip_prefix("irqbalance")
        .and_then(|rest| rest.strip_suffix(".sock"))
        .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
}

/// Why a `setup` answer names no banned CPUs.
#[derive(Debug, thiserror::Error)]
enum SetupAnswerError {
    #[error("not an irqbalance setup answer: {0:?}")]
    NotSetup(String),
    #[error("no BANNED mask in the setup answer {0:?}")]
    NoBannedMask(String),
    #[error("the BANNED mask {mask:?}: {source}")]
    BadMask {
        mask: String,
        #[source]
        source: CpuSetError,
    },
}

/// The banned CPUs of a `setup` answer: the hex mask after `BANNED`.
fn banned_of_setup(answer: &str) -> Result<CpuSet, SetupAnswerError> {
    let mut words = answer.split_whitespace();
    if words.next() != Some("SLEEP") {
        return Err(SetupAnswerError::NotSetup(answer.into()));
    }
    let mask = words
        .skip_while(|word| *word != "BANNED")
        .nth(1)
        .ok_or_else(|| SetupAnswerError::NoBannedMask(answer.into()))?;
    CpuSet::parse_hex_mask(mask).map_err(|source| SetupAnswerError::BadMask {
        mask: mask.into(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setup_answers() {
        let cases: &[(&str, Result<&str, &str>)] = &[
            ("SLEEP 10 BANNED 00000000", Ok("")),
            ("SLEEP 10 BANNED 0000000c", Ok("2-3")),
            ("SLEEP 1 BANNED 00000001,00000003", Ok("0-1,32")),
            (
                "SLEEP 10 IRQ 24 LOAD 0 DIFF 0 CLASS 3 IRQ 25 LOAD 0 DIFF 0 CLASS 3 BANNED 00000010",
                Ok("4"),
            ),
            ("SLEEP 10 ", Err("no BANNED")),
            ("BANNED 1", Err("not an irqbalance")),
            ("SLEEP 10 BANNED zz", Err("BANNED mask")),
            ("", Err("not an irqbalance")),
        ];
        for (answer, want) in cases {
            let got = banned_of_setup(answer);
            match (want, got) {
                (Ok(cpus), Ok(got)) => assert_eq!(got.to_cpulist(), *cpus, "{answer}"),
                (Err(part), Err(e)) => assert!(e.to_string().contains(part), "{answer}: {e}"),
                (want, got) => panic!("{answer}: want {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn socket_names() {
        for (name, is) in [
            ("irqbalance812.sock", true),
            ("irqbalance.sock", false),
            ("irqbalance12.sock.tmp", false),
            ("irqbalancex1.sock", false),
            ("other3.sock", false),
        ] {
            assert_eq!(is_socket_name(name), is, "{name}");
        }
    }
}
