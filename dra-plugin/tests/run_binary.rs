//! `dra-plugin run` as an OS process: config file plus flags, kubelet
//! registration, a prepare, the HTTP endpoints, the published slices, and a
//! graceful exit on SIGTERM that removes its sockets.

// A panic in test code is a failed test, not a crash on user input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{pod_uid, prepare_ok, Node, DRIVER, FIXTURE_NUMA_DEVICES, WAIT};
use dra_cpu_tests::kubelet_dra::{DraVersion, KubeletDra};
use dra_cpu_tests::served_series::{check_served, Series};
use dra_plugin::devices::DeviceMode;
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
    prepare_ok(&kubelet, &claim).await;
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
    upstream_series_are_served(&metrics);

    // The publisher put this node's pool on the API server.
    let names: Vec<String> = published_devices(&node)
        .await
        .into_iter()
        .map(|d| d.name)
        .collect();
    assert_eq!(names, FIXTURE_NUMA_DEVICES);

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

/// Text logs written to a pipe, as in a pod where `kubectl logs` shows them,
/// carry no ANSI colour codes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_logs_to_a_pipe_are_not_coloured() {
    let node = Node::new(DeviceMode::Grouped);
    let mut command = run_command(&node);
    command
        .arg("--log-format=text")
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR");
    let mut child = command.spawn().expect("spawn dra-plugin run");
    drop(register(&node, &mut child).await);
    let output = terminate_cleanly(child).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !stderr.contains("\x1b["),
        "colour codes in logs to a pipe: {stderr:?}"
    );
    assert!(
        stderr.lines().any(|l| l.contains(" INFO ")),
        "no text log line: {stderr}"
    );
}

/// The devices of the slices the daemon publishes for `node`, once there
/// are any (waiting up to [`WAIT`]).
async fn published_devices(node: &Node) -> Vec<k8s_openapi::api::resource::v1::Device> {
    let deadline = Instant::now() + WAIT;
    while node.api.slices().is_empty() && Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let slices = node.api.slices();
    assert!(!slices.is_empty(), "no ResourceSlice published");
    slices
        .into_iter()
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .collect()
}

/// `dra-plugin run` with every setting as a flag.
fn run_command(node: &Node) -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_dra-plugin"));
    command
        .arg("run")
        .args(node.run_flags())
        .arg("--cpu-device-mode=grouped")
        .arg("--metrics-address=127.0.0.1:0")
        .env_remove("NODE_NAME")
        .env_remove(dra_plugin::driver::crash_points::CRASH_AT_ENV)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    command
}

/// Register with the daemon `child`, or kill it and fail with its stderr.
async fn register(node: &Node, child: &mut std::process::Child) -> KubeletDra {
    match KubeletDra::register(&node.registry_dir(), DRIVER, DraVersion::V1, WAIT).await {
        Ok(k) => k,
        Err(e) => {
            let _ = child.kill();
            let mut stderr = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                let _ = pipe.read_to_string(&mut stderr);
            }
            panic!("registration: {e}; stderr: {stderr}");
        }
    }
}

/// SIGTERM `child` and wait for it, within [`WAIT`].
async fn terminate(child: std::process::Child) -> std::process::Output {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    wait_output(child).await
}

/// SIGTERM to `child`, which must exit cleanly; its output.
async fn terminate_cleanly(child: std::process::Child) -> std::process::Output {
    let output = terminate(child).await;
    assert!(
        output.status.success(),
        "exit {:?}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Wait for `child` to exit; past [`WAIT`] it is killed and the test fails.
async fn wait_output(child: std::process::Child) -> std::process::Output {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    let waiting = tokio::task::spawn_blocking(move || child.wait_with_output());
    tokio::pin!(waiting);
    let output = match tokio::time::timeout(WAIT, &mut waiting).await {
        Ok(joined) => joined,
        Err(_) => {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            let output = waiting.await.expect("join").expect("wait");
            panic!(
                "the daemon did not exit within {WAIT:?}; stderr: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    };
    output.expect("join").expect("wait")
}

/// Every file under `dir` with its contents, sorted by path.
fn files_under(dir: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).expect("read_dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let bytes = std::fs::read(&path).expect("read");
                files.push((path, bytes));
            }
        }
    }
    files.sort();
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_back_store_stops_the_daemon_and_is_left_as_found() {
    let node = Node::new(DeviceMode::Grouped);
    let mut child = run_command(&node).spawn().expect("spawn dra-plugin run");
    let kubelet = register(&node, &mut child).await;
    let claims: Vec<_> = (0..8)
        .map(|i| {
            let device = format!("cpudevnuma{:03}", i % 4);
            node.claim(&format!("c{i}"), &[(&device, Some("2"))], &pod_uid(i))
        })
        .collect();
    for claim in &claims {
        prepare_ok(&kubelet, claim).await;
    }
    drop(kubelet);
    terminate_cleanly(child).await;

    // The data file loses its second half (a torn copy, a restored backup):
    // sled alone would open the older half as if it were the whole store.
    let store_dir = node.config.store_dir();
    let data = store_dir.join("db");
    let len = std::fs::metadata(&data).expect("db").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&data)
        .expect("open db")
        .set_len(len / 2)
        .expect("truncate");
    let as_found = files_under(&store_dir);
    let cdi_before = files_under(&node.config.cdi_dir);

    let output = wait_output(run_command(&node).spawn().expect("spawn again")).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!("{stderr}");
    assert!(!output.status.success(), "started on a cut store: {stderr}");
    assert!(
        stderr.contains(&store_dir.display().to_string()),
        "the error names the store: {stderr}"
    );
    assert!(stderr.contains("are missing"), "{stderr}");
    assert!(
        files_under(&store_dir) == as_found,
        "the refused store was changed"
    );
    // Nothing was reconciled away either: the specs of all eight claims
    // are still there for kubelet and the runtime.
    assert!(files_under(&node.config.cdi_dir) == cdi_before);
    for claim in &claims {
        assert_eq!(node.cdi_cpus(&claim.uid).map(|c| c.len()), Some(2));
    }
    for socket in dra_plugin::run::sockets(&node.config) {
        assert!(!socket.exists(), "{} left behind", socket.display());
    }
}

/// What one SIGTERM-during-prepares round saw.
#[derive(Debug, Default)]
struct SigtermRound {
    acknowledged: usize,
    acknowledged_after_sigterm: usize,
    refused_or_cut: usize,
}

/// Fire `claims` concurrent prepares, SIGTERM the daemon as soon as the
/// first is answered, and check what it left behind.
async fn sigterm_during_prepares(claims: u32) -> SigtermRound {
    let node = std::sync::Arc::new(Node::new(DeviceMode::Grouped));
    let mut child = run_command(&node).spawn().expect("spawn dra-plugin run");
    let kubelet = std::sync::Arc::new(register(&node, &mut child).await);
    let claims: Vec<_> = (0..claims)
        .map(|i| {
            let device = format!("cpudevnuma{:03}", i % 4);
            node.claim(&format!("c{i}"), &[(&device, Some("2"))], &pod_uid(i))
        })
        .collect();
    let answered = std::sync::Arc::new(tokio::sync::Notify::new());
    let sigterm_sent = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let calls: Vec<_> = claims
        .iter()
        .cloned()
        .map(|claim| {
            let (kubelet, answered, sigterm_sent) =
                (kubelet.clone(), answered.clone(), sigterm_sent.clone());
            tokio::spawn(async move {
                let result = kubelet.prepare(std::slice::from_ref(&claim)).await;
                let after = sigterm_sent.load(std::sync::atomic::Ordering::SeqCst);
                answered.notify_one();
                let ok = match result {
                    Ok(answers) => answers[&claim.uid].error.is_empty(),
                    Err(_) => false,
                };
                (claim, ok, after)
            })
        })
        .collect();
    answered.notified().await;
    sigterm_sent.store(true, std::sync::atomic::Ordering::SeqCst);
    terminate_cleanly(child).await;
    for socket in dra_plugin::run::sockets(&node.config) {
        assert!(!socket.exists(), "{} left behind", socket.display());
    }

    // The store, read directly now that the daemon is gone.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dra-plugin"))
        .arg("inspect")
        .arg("--from-store")
        .arg(format!("--state-dir={}", node.config.state_dir.display()))
        .arg(format!("--sysfs-root={}", node.config.sysfs_root.display()))
        .output()
        .expect("dra-plugin inspect");
    assert!(out.status.success(), "inspect: {out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("inspect JSON");
    assert_eq!(report["source"], "store");
    let stored: std::collections::BTreeMap<String, shared_state::CpuSet> = report["claims"]
        .as_array()
        .expect("claims")
        .iter()
        .map(|c| {
            let cpus = c["cpus"].as_str().expect("cpus");
            (
                c["uid"].as_str().expect("uid").to_string(),
                shared_state::CpuSet::parse_cpulist(cpus).expect("cpulist"),
            )
        })
        .collect();

    let mut round = SigtermRound::default();
    for call in calls {
        let (claim, ok, after) = call.await.expect("prepare task");
        if ok {
            round.acknowledged += 1;
            round.acknowledged_after_sigterm += usize::from(after);
            // Acknowledged means durable: in the store, with the CPUs its
            // CDI spec gives the container.
            let spec = node.cdi_cpus(&claim.uid);
            assert!(
                spec.is_some(),
                "{}: acknowledged without a spec",
                claim.name
            );
            assert_eq!(
                stored.get(&claim.uid),
                spec.as_ref(),
                "{}: acknowledged prepare not in the store after exit",
                claim.name
            );
        } else {
            round.refused_or_cut += 1;
        }
    }
    // Whatever was stored without an answer is whole too: a spec per
    // claim, no CPU twice.
    let mut seen = shared_state::CpuSet::new();
    for (uid, cpus) in &stored {
        assert_eq!(node.cdi_cpus(uid).as_ref(), Some(cpus), "spec of {uid}");
        assert!(seen.is_disjoint(cpus), "{uid} shares CPUs: {cpus} / {seen}");
        seen = seen.union(cpus);
    }
    round
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_in_flight_prepares_finish_and_keeps_every_acknowledged_one() {
    // The race is real timing: repeat until a prepare was answered after
    // the SIGTERM was sent, so the in-flight path was exercised at least
    // once; every round checks the invariants.
    let mut rounds = Vec::new();
    for _ in 0..8 {
        let round = sigterm_during_prepares(40).await;
        let done = round.acknowledged_after_sigterm > 0;
        rounds.push(round);
        if done {
            break;
        }
    }
    eprintln!("SIGTERM rounds: {rounds:?}");
    assert!(
        rounds.iter().any(|r| r.acknowledged_after_sigterm > 0),
        "no prepare was in flight at SIGTERM in {} rounds: {rounds:?}",
        rounds.len()
    );
}

/// Kubelet's static CPU manager policy hands out exclusive CPUs of its own:
/// `dra-plugin run` refuses to start next to it, naming the state file and
/// the policy; with the `none` policy, or with the static one allowed
/// explicitly, it starts and registers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelets_static_cpu_manager_stops_the_start_unless_allowed() {
    let node = Node::new(DeviceMode::Grouped);
    let state = node.config.kubelet_root_dir.join("cpu_manager_state");
    std::fs::create_dir_all(&node.config.kubelet_root_dir).expect("kubelet root");
    std::fs::write(
        &state,
        r#"{"policyName":"static","defaultCpuSet":"0-15","entries":{},"checksum":1}"#,
    )
    .expect("write state");
    let output = wait_output(run_command(&node).spawn().expect("spawn")).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "started next to static: {stderr}");
    assert!(stderr.contains(&state.display().to_string()), "{stderr}");
    assert!(stderr.contains("\"static\""), "{stderr}");
    assert!(
        stderr.contains("--allow-kubelet-static-cpu-manager"),
        "{stderr}"
    );

    // Allowed explicitly: it starts.
    let mut child = run_command(&node)
        .arg("--allow-kubelet-static-cpu-manager")
        .spawn()
        .expect("spawn allowed");
    drop(register(&node, &mut child).await);
    terminate_cleanly(child).await;

    // The none policy: it starts without being told anything.
    std::fs::write(
        &state,
        r#"{"policyName":"none","defaultCpuSet":"","checksum":1353318690}"#,
    )
    .expect("write state");
    let mut child = run_command(&node).spawn().expect("spawn with none");
    drop(register(&node, &mut child).await);
    terminate_cleanly(child).await;
}

/// `SSL_CERT_FILE` (an empty file) and `SSL_CERT_DIR` (an empty directory):
/// with either set, rustls-native-certs reads nothing else, as on a host
/// without CA certificates.
fn without_system_certificates(command: &mut std::process::Command, dir: &std::path::Path) {
    let file = dir.join("no-certificates.pem");
    let certs = dir.join("no-certificates");
    std::fs::write(&file, "").expect("empty bundle");
    std::fs::create_dir_all(&certs).expect("empty directory");
    command
        .env("SSL_CERT_FILE", file)
        .env("SSL_CERT_DIR", certs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_api_server_needs_no_system_certificates() {
    let node = Node::new(DeviceMode::Grouped);
    let mut command = run_command(&node);
    without_system_certificates(&mut command, node.dir.path());
    let mut child = command.spawn().expect("spawn dra-plugin run");
    let kubelet = register(&node, &mut child).await;
    published_devices(&node).await;
    drop(kubelet);
    terminate_cleanly(child).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_kubeconfig_without_a_ca_and_no_system_certificates_is_refused_clearly() {
    let node = Node::new(DeviceMode::Grouped);
    // The kubeconfig the command names now points at an https server.
    let kubeconfig = node.config.kubeconfig.clone().expect("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n    token: t\n",
    )
    .expect("kubeconfig");
    let mut command = run_command(&node);
    without_system_certificates(&mut command, node.dir.path());
    let child = command.spawn().expect("spawn dra-plugin run");
    let output = wait_output(child).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "it started: {stderr}");
    assert!(
        stderr.contains("names no certificate-authority for https://127.0.0.1:1"),
        "{stderr}"
    );
    assert!(
        stderr.contains("No CA certificates were loaded"),
        "{stderr}"
    );
}

/// The upstream Go driver's series of dra-plugin, as its `pkg/metrics`
/// declares them: name, type, help, label names.
const UPSTREAM_DRIVER_SERIES: [Series; 9] = [
    ("dra_cpu_allocated_cpus", "gauge", "Number of CPUs currently allocated to prepared resource claims.", &[]),
    ("dra_cpu_available_cpus", "gauge", "Number of CPUs available for allocation after reserved and active claim CPUs are excluded.", &[]),
    ("dra_cpu_reserved_cpus", "gauge", "Number of CPUs reserved and excluded from DRA management.", &[]),
    ("dra_cpu_resource_claims_active", "gauge", "Number of resource claims currently recorded as active by the allocation store.", &[]),
    ("dra_cpu_prepare_claims_total", "counter", "Total number of per-claim PrepareResourceClaims results.", &["result"]),
    ("dra_cpu_unprepare_claims_total", "counter", "Total number of per-claim UnprepareResourceClaims results.", &["result"]),
    ("dra_cpu_prepare_claim_duration_seconds", "histogram", "Duration of per-claim prepare operations in seconds.", &[]),
    ("dra_cpu_unprepare_claim_duration_seconds", "histogram", "Duration of per-claim unprepare operations in seconds.", &[]),
    ("dra_cpu_claim_allocated_cpus", "histogram", "Number of CPUs allocated for each newly successful claim allocation.", &[]),
];

/// One sample's plain value (counter or gauge), by name and labels.
fn sample_value(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    let sample = scrape
        .samples
        .iter()
        .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .unwrap_or_else(|| panic!("no sample {name} {labels:?}"));
    match sample.value {
        prometheus_parse::Value::Counter(v) | prometheus_parse::Value::Gauge(v) => v,
        ref other => panic!("{name} is {other:?}"),
    }
}

/// Parse `/metrics` with a Prometheus text-format parser and check every
/// upstream series by name, type, help and labels, and the values after one
/// prepare of 2 CPUs on a 128-CPU node with nothing reserved.
fn upstream_series_are_served(text: &str) {
    let scrape = check_served(text, &UPSTREAM_DRIVER_SERIES);
    for result in ["success", "error", "unknown"] {
        for name in [
            "dra_cpu_prepare_claims_total",
            "dra_cpu_unprepare_claims_total",
        ] {
            let want = if (name, result) == ("dra_cpu_prepare_claims_total", "success") {
                1.0
            } else {
                0.0
            };
            assert_eq!(
                sample_value(&scrape, name, &[("result", result)]),
                want,
                "{name} {result}"
            );
        }
    }
    for (name, want) in [
        ("dra_cpu_allocated_cpus", 2.0),
        ("dra_cpu_available_cpus", 126.0),
        ("dra_cpu_reserved_cpus", 0.0),
        ("dra_cpu_resource_claims_active", 1.0),
    ] {
        assert_eq!(sample_value(&scrape, name, &[]), want, "{name}");
    }
    let allocated = scrape
        .samples
        .iter()
        .find(|s| s.metric == "dra_cpu_claim_allocated_cpus")
        .map(|s| s.value.clone());
    let Some(prometheus_parse::Value::Histogram(buckets)) = allocated else {
        panic!("dra_cpu_claim_allocated_cpus: {allocated:?}");
    };
    let count_at = |bound: f64| {
        buckets
            .iter()
            .find(|b| b.less_than == bound)
            .map(|b| b.count)
    };
    assert_eq!(count_at(1.0), Some(0.0), "{buckets:?}");
    assert_eq!(count_at(2.0), Some(1.0), "{buckets:?}");
    assert_eq!(count_at(f64::INFINITY), Some(1.0), "{buckets:?}");
}

/// Upstream's example config, the `driverConfig` of its
/// docs/user/configuration.md ("#### Example"), which its chart writes as
/// the file passed to `--config`.
const UPSTREAM_EXAMPLE_CONFIG: &str = "apiVersion: v1alpha1
cpuDeviceMode: grouped
groupBy: numanode
reservedCPUs: \"0-3\"
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstreams_example_config_starts_the_daemon_with_its_settings() {
    let node = Node::new(DeviceMode::Individual);
    let port = free_port();
    let config_file = node.dir.path().join("config.yaml");
    std::fs::write(&config_file, UPSTREAM_EXAMPLE_CONFIG).expect("config file");
    // Flags say where things are on this test node and nothing the file says.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_dra-plugin"))
        .arg("run")
        .arg("--config")
        .arg(&config_file)
        .args(node.run_flags())
        .arg(format!("--metrics-address=127.0.0.1:{port}"))
        .env_remove("NODE_NAME")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn dra-plugin run");
    let _kubelet = register(&node, &mut child).await;

    let devices = published_devices(&node).await;
    // grouped by NUMA node, as the file says (the test node was made
    // individual, so the file's mode is the one in force).
    let names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, FIXTURE_NUMA_DEVICES);
    // 128 CPUs less the 4 reserved ones are published.
    let published: i64 = devices
        .iter()
        .flat_map(|d| d.capacity.clone().unwrap_or_default().into_values())
        .map(|c| c.value.0.parse::<i64>().expect("integer capacity"))
        .sum();
    assert_eq!(published, 124);
    // Upstream's default: no KEP-5517 mapping without the key.
    assert!(
        devices
            .iter()
            .all(|d| d.node_allocatable_resources.is_none()),
        "{devices:?}"
    );
    let (status, metrics) = tokio::task::spawn_blocking(move || http_get(port, "/metrics"))
        .await
        .expect("get");
    assert_eq!(status, 200);
    assert!(
        metrics.lines().any(|l| l == "dra_cpu_reserved_cpus 4"),
        "{metrics}"
    );

    terminate_cleanly(child).await;
}

#[test]
fn a_mixed_config_file_is_refused_naming_the_keys() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config_file = dir.path().join("config.yaml");
    std::fs::write(
        &config_file,
        format!("{UPSTREAM_EXAMPLE_CONFIG}state-dir: /var/lib/dra-cpu\n"),
    )
    .expect("config file");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_dra-plugin"))
        .arg("run")
        .arg("--config")
        .arg(&config_file)
        .arg("--node-name=n")
        .env_remove("NODE_NAME")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run dra-plugin");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("state-dir") && stderr.contains("apiVersion"),
        "{stderr}"
    );
}

/// `--device-metadata-dir` (the chart points it at a tmpfs): the files are
/// written there, the claim's CDI device mounts them from there, and files
/// an earlier start left in the default place are removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_metadata_goes_to_its_configured_directory() {
    let node = Node::new(DeviceMode::Grouped);
    let default_root =
        dra_plugin::device_metadata::default_host_root(&node.config.plugin_data_dir());
    let stale = default_root.join("team_old/cpus/metadata.json");
    std::fs::create_dir_all(stale.parent().expect("parent")).expect("mkdir");
    std::fs::write(&stale, b"{}\n").expect("stale file");
    let configured = node.config.state_dir.join("run-md");

    let mut child = run_command(&node)
        .arg(format!("--device-metadata-dir={}", configured.display()))
        .spawn()
        .expect("spawn dra-plugin run");
    let kubelet = register(&node, &mut child).await;
    let claim = node.claim("c0", &[("cpudevnuma000", Some("2"))], &pod_uid(0));
    prepare_ok(&kubelet, &claim).await;

    let written = files_under(&configured);
    assert_eq!(written.len(), 1, "one request, one file: {written:?}");
    let (path, body) = &written[0];
    assert_eq!(
        path.file_name().and_then(|n| n.to_str()),
        Some("metadata.json")
    );
    assert!(
        String::from_utf8_lossy(body).contains(&claim.uid),
        "the file names its claim"
    );
    let spec = node.cdi_spec(&claim.uid).expect("CDI spec");
    let host_paths: Vec<&str> = spec
        .pointer("/devices/0/containerEdits/mounts")
        .and_then(|m| m.as_array())
        .map(|mounts| {
            mounts
                .iter()
                .filter_map(|m| m["hostPath"].as_str())
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(host_paths, [path.to_str().expect("utf-8 path")]);
    assert!(
        !default_root.exists(),
        "the default place still holds files"
    );

    terminate_cleanly(child).await;
}
