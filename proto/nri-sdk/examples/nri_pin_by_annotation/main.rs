//! A tiny NRI plugin: logs events and pins containers by annotation.
//!
//! ```text
//! cargo run -p dra-cpu-nri --example nri_pin_by_annotation -- [--socket PATH] [--name NAME] [--index NN]
//! ```
//!
//! When started by the runtime itself, it uses the connection the runtime
//! passes in `NRI_PLUGIN_SOCKET`; otherwise it connects to `--socket`
//! (default `/var/run/nri/nri.sock`) and reconnects whenever the runtime
//! restarts. See `plugin.rs` for the annotations it understands.

mod plugin;

use std::sync::Arc;

use dra_cpu_nri::client::{
    run_with_reconnect, NriClientOptions, NriUpdater, SocketSource, DEFAULT_NRI_SOCKET,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut socket = DEFAULT_NRI_SOCKET.to_string();
    let mut name = "pin_by_annotation".to_string();
    let mut index = "50".to_string();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--socket" => socket = value,
            "--name" => name = value,
            "--index" => index = value,
            other => return Err(format!("unknown flag {other}").into()),
        }
    }

    let source = SocketSource::from_env_or(socket)?;
    let options = NriClientOptions::new(name, index);
    let plugin = Arc::new(plugin::PinByAnnotation::new());
    let stop = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    run_with_reconnect(plugin.clone(), source, options, NriUpdater::new(), stop).await?;
    eprintln!("nri example: stopping after {} events", plugin.seen().len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::plugin::*;

    #[test]
    fn cpulist_validation_table() {
        for (text, ok) in [
            ("0", true),
            ("0-3", true),
            ("1,4-5", true),
            ("", false),
            ("3-1", false),
            ("a", false),
            ("1,", false),
        ] {
            assert_eq!(valid_cpulist(text), ok, "{text:?}");
        }
    }

    #[test]
    fn also_update_parsing() {
        assert_eq!(
            parse_also_update("abc:0-1").unwrap(),
            ("abc".to_string(), "0-1".to_string())
        );
        assert!(parse_also_update("abc").is_err());
        assert!(parse_also_update(":0").is_err());
        assert!(parse_also_update("abc:x").is_err());
    }

    #[test]
    fn pin_update_sets_only_the_cpuset() {
        let update = pin_update("c1", "1");
        assert_eq!(update.container_id, "c1");
        let cpu = update.linux.resources.cpu.clone().unwrap();
        assert_eq!(cpu.cpus, "1");
        assert!(cpu.shares.is_none() && cpu.mems.is_empty());
    }
}
