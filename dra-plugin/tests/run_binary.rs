//! `dra-plugin run` as an OS process: config file plus flags, kubelet
//! registration, a prepare, the HTTP endpoints, the published slices, and a
//! graceful exit on SIGTERM that removes its sockets.

mod common;

use common::{pod_uid, Node, DRIVER, WAIT};
use dra_cpu_tests::kubelet_dra::{DraVersion, KubeletDra};
use dra_plugin::config::DeviceMode;
use std::io::{Read, Write};
use std::time::Instant;

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

fn http_get(port: u16, path: &str) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_serves_and_exits_cleanly_on_sigterm() {
    let node = Node::new(DeviceMode::Grouped);
    let port = free_port();
    let config_file = node.dir.path().join("config.yaml");
    let c = &node.config;
    // The file holds most settings; flags override two of them.
    std::fs::write(
        &config_file,
        format!(
            "node-name: {}\nkubeconfig: {}\nkubelet-root-dir: {}\nstate-dir: {}\ncdi-dir: {}\nsysfs-root: {}\ncpu-device-mode: individual\nmetrics-address: 127.0.0.1:1\nlog-format: json\n",
            c.node_name,
            c.kubeconfig.as_ref().expect("kubeconfig").display(),
            c.kubelet_root_dir.display(),
            c.state_dir.display(),
            c.cdi_dir.display(),
            c.sysfs_root.display(),
        ),
    )
    .expect("config file");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_dra-plugin"))
        .arg("run")
        .arg("--config")
        .arg(&config_file)
        .arg("--cpu-device-mode=grouped")
        .arg(format!("--metrics-address=127.0.0.1:{port}"))
        .env_remove("NODE_NAME")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn dra-plugin run");

    let kubelet =
        match KubeletDra::register(&node.registry_dir(), DRIVER, DraVersion::V1, WAIT).await {
            Ok(k) => k,
            Err(e) => {
                let _ = child.kill();
                let output = child.wait_with_output().expect("wait");
                panic!(
                    "registration: {e}; stderr: {}",
                    String::from_utf8_lossy(&output.stderr)
                );
            }
        };
    // The flag won over the file: grouped devices.
    let claim = node.claim("web", &[("cpudevnuma000", Some("2"))], &pod_uid(1));
    let answers = kubelet
        .prepare(std::slice::from_ref(&claim))
        .await
        .expect("prepare");
    assert_eq!(answers[&claim.uid].error, "");
    assert_eq!(node.cdi_cpus(&claim.uid).map(|c| c.len()), Some(2));

    let (status, _) = tokio::task::spawn_blocking(move || http_get(port, "/healthz"))
        .await
        .expect("get");
    assert_eq!(status, 200);
    let (status, _) = tokio::task::spawn_blocking(move || http_get(port, "/readyz"))
        .await
        .expect("get");
    assert_eq!(status, 200);
    let (status, metrics) = tokio::task::spawn_blocking(move || http_get(port, "/metrics"))
        .await
        .expect("get");
    assert_eq!(status, 200);
    assert!(metrics.contains("dra_cpu_prepares_total 1"), "{metrics}");
    assert!(metrics.contains("dra_cpu_exclusive_cpus 2"), "{metrics}");
    assert!(
        metrics.contains("dra_cpu_shared_pool_cpus 126"),
        "{metrics}"
    );

    // The publisher put this node's pool on the API server.
    let deadline = Instant::now() + WAIT;
    while node.api.slices().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let slices = node.api.slices();
    assert!(!slices.is_empty(), "no ResourceSlice published");
    let names: Vec<String> = slices
        .iter()
        .flat_map(|s| s.spec.devices.clone().unwrap_or_default())
        .map(|d| d.name)
        .collect();
    assert_eq!(
        names,
        [
            "cpudevnuma000",
            "cpudevnuma001",
            "cpudevnuma002",
            "cpudevnuma003"
        ]
    );

    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let output = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("join")
        .expect("wait");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "exit {:?}: {stderr}",
        output.status
    );
    // JSON logs, as the file asked.
    let first_line = stderr.lines().next().unwrap_or("");
    assert!(
        serde_json::from_str::<serde_json::Value>(first_line).is_ok(),
        "{first_line}"
    );
    for socket in dra_plugin::run::sockets(&node.config) {
        assert!(!socket.exists(), "{} left behind", socket.display());
    }
    // The prepared claim survives the exit.
    assert_eq!(node.cdi_cpus(&claim.uid).map(|c| c.len()), Some(2));
}
