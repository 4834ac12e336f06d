//! A real irqbalance, started by a test, and asked through its socket what
//! it bans: the daemon dra-plugin tells to keep interrupts off tuned CPUs.

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, UnixCredentials};
use shared_state::CpuSet;
use std::io::{self, IoSlice, Read};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where irqbalance binds its socket (compiled in).
pub const RUN_DIR: &str = "/run/irqbalance";

/// A running `irqbalance --foreground`, killed when dropped.
pub struct IrqBalance {
    child: Child,
    socket: PathBuf,
}

impl IrqBalance {
    /// Starts it and waits for its socket to answer.
    pub fn start() -> io::Result<IrqBalance> {
        std::fs::create_dir_all(RUN_DIR)?;
        let child = Command::new("irqbalance")
            .arg("--foreground")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let socket = PathBuf::from(RUN_DIR).join(format!("irqbalance{}.sock", child.id()));
        let mut daemon = IrqBalance { child, socket };
        let started = Instant::now();
        loop {
            if daemon.request("setup").is_ok() {
                return Ok(daemon);
            }
            if let Some(status) = daemon.child.try_wait()? {
                return Err(io::Error::other(format!("irqbalance exited: {status}")));
            }
            if started.elapsed() > Duration::from_secs(20) {
                return Err(io::Error::other(format!(
                    "irqbalance answered nothing on {} in 20 s",
                    daemon.socket.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Its socket's file name.
    pub fn name(&self) -> String {
        format!("irqbalance{}.sock", self.child.id())
    }

    /// One request as root, with the credentials irqbalance requires; the
    /// answer, read until it closes the connection.
    pub fn request(&self, command: &str) -> io::Result<String> {
        let stream = UnixStream::connect(&self.socket)?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
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
        (&stream).read_to_string(&mut answer)?;
        Ok(answer)
    }

    /// The CPUs it keeps interrupts off (the mask after `BANNED` in its
    /// `setup` answer), as of its last rescan.
    pub fn banned(&self) -> io::Result<CpuSet> {
        let answer = self.request("setup")?;
        let mask = answer
            .split_whitespace()
            .skip_while(|w| *w != "BANNED")
            .nth(1)
            .ok_or_else(|| io::Error::other(format!("no BANNED in {answer:?}")))?;
        CpuSet::parse_hex_mask(mask).map_err(io::Error::other)
    }
}

impl Drop for IrqBalance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}
