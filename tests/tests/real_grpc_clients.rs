//! `dra-plugin run` reached by real clients of other gRPC stacks, as on a
//! node: a grpc-go program with kubelet's exact dial options (registration
//! with no authority option, so grpc-go sends the socket path,
//! percent-encoded, as the HTTP/2 `:authority`; the DRA socket as kubelet's
//! DRA plugin manager dials it) and Python grpcio (C-core) with its default
//! authority. Before the authority rewrite of `dra_cpu_transport`,
//! every such call was refused with RST_STREAM PROTOCOL_ERROR.
//!
//! Needs Go with Debian's grpc-go and protobuf packages, and grpcio
//! (`scripts/install-deps.sh`); without them these tests skip, or fail when
//! `CI` is set.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dra_cpu_tests::apiserver::FakeApiServer;
use dra_cpu_tests::node::claim_objects::{allocated_claim, device_class};
use dra_cpu_tests::node::layout::{binary_candidates, dra_plugin_args, NodeLayout, NodeOptions};
use dra_cpu_tests::node::{DRA_PLUGIN_BIN_ENV, DRIVER_NAME, NAMESPACE};
use dra_cpu_tests::real_clients::{
    grpcio_get_info_script, kubelet_go_client, python_with_grpcio, RealClientError,
};
use dra_cpu_tests::skip::skip_or_fail_in_ci;
use serde_json::Value;
use shared_state::cdi_spec::CDI_KIND;

const NODE: &str = "node-a";
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A running `dra-plugin run` against a fake API server, in its own
/// directory; killed on drop.
struct Plugin {
    api: FakeApiServer,
    layout: NodeLayout,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
}

fn dra_plugin_binary() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let env = std::env::var(DRA_PLUGIN_BIN_ENV).ok();
    let candidates = binary_candidates("dra-plugin", env.as_deref(), &target);
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .unwrap_or_else(|| panic!("dra-plugin not built; looked at {candidates:?}"))
}

impl Plugin {
    /// Starts dra-plugin and waits for its registration socket.
    fn start() -> Plugin {
        // Under /tmp for short socket paths.
        let dir = tempfile::Builder::new()
            .prefix("dcpu-real-")
            .tempdir_in("/tmp")
            .expect("temp dir");
        let api = FakeApiServer::start().expect("fake API server");
        api.insert_node(NODE).expect("node");
        api.insert_device_class(device_class().expect("device class"))
            .expect("device class");
        let layout = NodeLayout {
            dir: dir.path().to_path_buf(),
            nri_socket: dir.path().join("no-runtime/nri.sock"),
            cdi_dir: dir.path().join("cdi"),
            kubeconfig: api.kubeconfig_path().to_path_buf(),
            dra_metrics: free_port(),
            nri_metrics: free_port(),
        };
        for d in [
            layout.plugins_registry(),
            layout.state_dir(),
            layout.cdi_dir.clone(),
        ] {
            std::fs::create_dir_all(&d).expect("plugin directories");
        }
        let options = NodeOptions {
            node_name: NODE.into(),
            ..NodeOptions::default()
        };
        let log = std::fs::File::create(layout.dra_log()).expect("log file");
        let child = Command::new(dra_plugin_binary())
            .args(dra_plugin_args(&layout, &options))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .expect("starting dra-plugin");
        let mut plugin = Plugin {
            api,
            layout,
            child,
            _dir: dir,
        };
        let socket = plugin.registration_socket();
        let started = Instant::now();
        while !socket.exists() {
            if let Ok(Some(status)) = plugin.child.try_wait() {
                panic!("dra-plugin exited ({status}):\n{}", plugin.log());
            }
            assert!(
                started.elapsed() < START_TIMEOUT,
                "no registration socket after {START_TIMEOUT:?}:\n{}",
                plugin.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        plugin
    }

    fn registration_socket(&self) -> PathBuf {
        self.layout
            .plugins_registry()
            .join(format!("{DRIVER_NAME}-reg.sock"))
    }

    fn dra_socket(&self) -> PathBuf {
        self.layout
            .kubelet_root()
            .join("plugins")
            .join(DRIVER_NAME)
            .join("dra.sock")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.layout.dra_log()).unwrap_or_default()
    }

    /// A claim of one CPU, allocated on this node for a pod; its uid.
    fn insert_claim(&self, name: &str) -> String {
        let claim = allocated_claim(
            name,
            NODE,
            1,
            "pod-real",
            "00000000-0000-4000-8000-0000000000aa",
        )
        .expect("claim");
        let stored = self.api.insert_claim(claim).expect("inserting the claim");
        stored.metadata.uid.expect("a stored claim has a uid")
    }
}

/// The client found, and a plugin started for it; without the client,
/// `None`: the test skips (or fails when `CI` is set).
fn plugin_for(client: Result<PathBuf, RealClientError>) -> Option<(PathBuf, Plugin)> {
    match client {
        Ok(client) => Some((client, Plugin::start())),
        Err(e) => {
            skip_or_fail_in_ci(e);
            None
        }
    }
}

/// The JSON lines client `what` printed; its failure fails the test.
fn run_client(plugin: &Plugin, what: &str, mut command: Command) -> Vec<Value> {
    let output = command.output().expect("running the client");
    let lines: Vec<Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("client printed {line:?}: {e}"))
        })
        .collect();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{what} client failed: {lines:#?}\n{stderr}\ndra-plugin log:\n{}",
        plugin.log()
    );
    lines
}

/// GetInfo's answer names this driver's DRA plugin and its socket.
fn assert_plugin_info(info: &Value, plugin: &Plugin) {
    assert_eq!(info["type"], "DRAPlugin", "{info}");
    assert_eq!(info["name"], DRIVER_NAME, "{info}");
    assert_eq!(
        info["endpoint"].as_str(),
        plugin.dra_socket().to_str(),
        "{info}"
    );
}

fn step<'a>(lines: &'a [Value], name: &str) -> &'a Value {
    lines
        .iter()
        .find(|l| l["step"] == name)
        .unwrap_or_else(|| panic!("no {name} step in {lines:#?}"))
}

#[test]
fn kubelet_go_client_registers_prepares_unprepares_and_reads_health() {
    let Some((client, plugin)) = plugin_for(kubelet_go_client()) else {
        return;
    };
    let uid = plugin.insert_claim("claim-go");

    let mut command = Command::new(client);
    command
        .arg("-registration")
        .arg(plugin.registration_socket())
        .args(["-claim-namespace", NAMESPACE, "-claim-name", "claim-go"])
        .args(["-claim-uid", &uid, "-health"]);
    let lines = run_client(&plugin, "grpc-go", command);

    assert_plugin_info(step(&lines, "GetInfo"), &plugin);
    step(&lines, "NotifyRegistrationStatus");

    let prepared = step(&lines, "NodePrepareResources");
    assert_eq!(prepared["claim_error"], "", "{prepared}");
    assert_eq!(
        prepared["cdi_device_ids"],
        serde_json::json!([format!("{CDI_KIND}=claim-{uid}")]),
        "{prepared}"
    );
    let unprepared = step(&lines, "NodeUnprepareResources");
    assert_eq!(unprepared["claim_error"], "", "{unprepared}");

    let health = step(&lines, "NodeWatchResources");
    let devices = health["devices"].as_u64().unwrap_or(0);
    assert!(devices > 0, "no device in the health report: {health}");
    assert_eq!(health["healthy"].as_u64(), Some(devices), "{health}");
}

#[test]
fn grpcio_client_with_its_default_authority_gets_info() {
    let Some((python, plugin)) = plugin_for(python_with_grpcio()) else {
        return;
    };
    let mut command = Command::new(python);
    command
        .arg(grpcio_get_info_script())
        .arg(plugin.registration_socket());
    let lines = run_client(&plugin, "grpcio", command);
    assert_plugin_info(lines.first().expect("one line of PluginInfo"), &plugin);
}
